"""``Quantized`` on 3 real processes (``torchrun``, Gloo), where the chunks of a bucket split its
layers unevenly; the 2-rank runs are in the Horovod torch (Gloo, MPI) and DDP launches."""
import pytest

from tests.conftest import check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("quantized_checks"))
def test_quantized_on_three_ranks(launches, check):
    launches("quantized_checks", "torchrun", np=3).check(check)


def test_an_owner_memory_that_changes_hands_moves_into_the_ranks_own_memory_w_times_over():
    """When the world size changes (elastic), this rank owns other entries: before the next step,
    what it held as their owner goes into its own memory, W times over (the next average divides
    it by W again), and nothing is left where it no longer owns. Rank 0 of the advisor's simulated
    world owns the first part of a 300-value layer: [0, 192) on 2 ranks, [0, 128) on 3."""
    import torch

    from horovod_accordion.advise.profile import SimulatedWorld
    from horovod_accordion.core.compression import Quantized
    from horovod_accordion.core.reducers import QuantizedReducer

    world = SimulatedWorld(2)
    reducer = QuantizedReducer([(300,)], Quantized(4), world.tensors, world)
    grad = torch.randn(300, generator=torch.Generator().manual_seed(0))
    reducer.reduce([grad])
    assert reducer.owned[0] == (0, 192)
    # Where a simulated world's ranks all send the same values, the owner's average is already on
    # the grid and leaves no error: give it one, as real ranks' different gradients would.
    reducer.owner_memory[0][:192] = torch.randn(192, generator=torch.Generator().manual_seed(1)) / 64
    memory, owner = reducer.memory[0].clone(), reducer.owner_memory[0].clone()

    reducer.collectives = SimulatedWorld(3)
    reducer._keep_owner_memory_of([(0, grad)], [(0, 0, 128, 0)], 3)
    assert reducer.owned[0] == (0, 128)
    assert torch.equal(reducer.owner_memory[0][:128], owner[:128])
    assert torch.equal(reducer.owner_memory[0][128:], torch.zeros(172))
    assert torch.equal(reducer.memory[0][:128], memory[:128])
    assert torch.equal(reducer.memory[0][128:], memory[128:] + 3 * owner[128:])


def test_one_rank_with_any_block_and_bits_dequantizes_its_scales():
    """With one rank the all-to-all's and the all-gather's results are one row, whose scales may
    start at a byte offset that is no multiple of 4 (3 bits × 8 values): they are read from a
    copy. The average of one rank is its gradient, quantized twice: within two steps of the grid."""
    import torch

    from horovod_accordion.advise.profile import SimulatedWorld
    from horovod_accordion.core.compression import Quantized
    from horovod_accordion.core.reducers import QuantizedReducer

    for bits in (2, 3, 5, 6, 7, 8):
        world = SimulatedWorld(1)
        reducer = QuantizedReducer([(8,), (3, 5)], Quantized(bits, block_size=8), world.tensors, world)
        grads = [torch.randn(8, generator=torch.Generator().manual_seed(0)), torch.randn(3, 5)]
        for grad, average in zip(grads, reducer.reduce(grads)):
            step = grad.abs().max() / (2 ** (bits - 1) - 1)  # the coarsest scale a block of it can have
            assert average.shape == grad.shape and (average - grad).abs().max() <= 2 * step, bits


def packed_reference(codes, bits):
    """The documented layout, one byte at a time: where bits divides 8, code j of a byte in its
    bits j·b … j·b + b − 1; else each 8 codes as ``bits`` bytes, byte p holding bit p of code j
    in its bit j. TensorFlow's ``_pack`` writes the same bytes."""
    out = []
    for row in codes.tolist():
        packed = []
        if 8 % bits == 0:
            per_byte = 8 // bits
            for start in range(0, len(row), per_byte):
                packed.append(sum(code << (j * bits) for j, code in enumerate(row[start:start + per_byte])))
        else:
            for start in range(0, len(row), 8):
                group = row[start:start + 8]
                packed += [sum(((code >> plane) & 1) << j for j, code in enumerate(group)) for plane in range(bits)]
        out.append(packed)
    return out


def test_the_packed_codes_have_the_documented_layout_and_unpack_to_themselves():
    import torch

    from horovod_accordion.torch_common.tensors import _pack, _unpack

    for bits in range(2, 9):
        codes = torch.randint(0, 2 ** bits, (2, 64), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
        packed = _pack(codes, bits)
        assert packed.dtype == torch.uint8 and packed.tolist() == packed_reference(codes, bits), bits
        assert torch.equal(_unpack(packed, bits), codes), bits


def test_a_zero_block_has_scale_plus_zero_and_a_non_finite_block_a_non_finite_scale():
    import math

    import torch

    from horovod_accordion.torch_common.tensors import TorchTensorOps

    tensors = TorchTensorOps()
    blocks = torch.tensor([[0.0] * 4 + [-0.0] * 4 + [-1.0, -2.0, -3.0, -4.0] + [1.0, math.inf, 2.0, 3.0]
                           + [math.nan, 1.0, -1.0, 0.0] + [-math.inf, 0.0, 0.0, 1.0]])
    for bits in (2, 3, 4, 8):
        wire, sent = tensors.quantize(blocks, bits, 4)
        scales = wire[0, -6 * 4:].clone().view(torch.float32)
        assert scales[:2].tolist() == [0.0, 0.0] and not any(math.copysign(1.0, s) < 0 for s in scales[:2].tolist())
        assert scales[2].item() == (torch.tensor(4.0) * (1.0 / (2 ** (bits - 1) - 1))).item()  # fp32(4 · fp32(1/L))
        assert not torch.isfinite(scales[3:]).any(), (bits, scales)
        back = tensors.dequantize(wire, bits, 4)
        assert torch.equal(back[0, :8], torch.zeros(8)) and not torch.isfinite(back[0, 12:]).any(), (bits, back)


def test_gradient_and_memory_are_added_in_fp32_straight_into_their_columns():
    """``as_columns(plus=)`` against the sum taken first and placed after: bf16 and fp32
    gradients, a layer smaller than its width, one that fills every row, one with a partial row,
    and one carrying an autograd history."""
    import torch

    from horovod_accordion.torch_common.tensors import TorchTensorOps

    tensors, generator = TorchTensorOps(), torch.Generator().manual_seed(0)
    grads = [torch.randn(5, generator=generator).bfloat16(), torch.randn(384, generator=generator),
             torch.randn(200, generator=generator, requires_grad=True)]
    memories = [torch.randn(g.numel(), generator=generator) for g in grads]
    widths, rows = [64, 128, 128], 3
    added = tensors.as_columns([g.float() for g in grads], widths, rows, plus=memories)
    placed = tensors.as_columns([g.detach().float() + m for g, m in zip(grads, memories)], widths, rows)
    assert torch.equal(added, placed) and added.dtype == torch.float32
    assert torch.equal(tensors.difference(added, placed), torch.zeros(rows, sum(widths)))
