"""A byte-level transformer language model on the standard library's sources, with Accordion:
the study's transformer program (``benchmarks/study.py --setting stdlib-transformer``).

    horovodrun -np 2 --gloo python examples/transformer_lm.py --compression powersgd --levels 16 4

The data is ``stdlib_text``'s: every install has it, nothing is downloaded. The model is a
decoder-only transformer with token and position embeddings, ``--layers`` pre-norm blocks of
causal self-attention and a GELU MLP, and an untied output matrix. The recipe is AdamW (or
SGD with momentum, ``--optimizer sgd``) with a linear warm-up and a cosine decay to a tenth
of the peak rate, per step; ``--precision bf16`` runs the forward pass under bf16 autocast
(the weights, gradients and what is sent stay fp32).

Training is counted in windows of ``--steps-per-window`` steps: a window is what the
optimizer's ``end_epoch()`` closes (Accordion's checks come every ``--interval`` windows),
and the record calls it an epoch. ``--compression``, ``--levels`` and ``--policy`` are
``pytorch_train.py``'s. Rank 0 writes, with ``--record``, one JSON line per window
(validation loss in nats per byte, perplexity, bytes sent per rank, each layer's level), the
checks and decays, and a ``done`` line; its ``config`` line holds the data's digest, which
every rank checked to be its own.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

import horovod_accordion.torch as hvd
from progress import epochs_bar
from stdlib_text import VOCABULARY, Corpus
from study_run import RunRecord, add_compression_arguments, compression_of, policy_of, show_epoch

PEAK_LR = {"adamw": 3e-3, "sgd": 0.3}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compression_arguments(parser, levels=(16, 4))
    parser.add_argument("--interval", type=int, default=2, help="windows between Accordion checks")
    parser.add_argument("--optimizer", choices=sorted(PEAK_LR), default="adamw")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast")
    parser.add_argument("--lr", type=float, help="the peak rate (default: 3e-3 for AdamW, 0.3 for SGD)")
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--windows", type=int, default=30)
    parser.add_argument("--steps-per-window", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--context", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--width", type=int, default=64, help="the model dimension d")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--validation-sequences", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", help="rank 0 writes the per-window JSONL record here")
    parser.add_argument("--tensorboard-dir", help="rank 0 writes Accordion's scalars here")
    parser.add_argument("--no-progress", action="store_true", help="no per-window progress; the result line stays")
    return parser.parse_args(argv)


class Attention(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.projection = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.projection(y.transpose(1, 2).reshape(batch, length, width))


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.mlp_norm = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(torch.nn.Module):
    def __init__(self, width, layers, heads, context):
        super().__init__()
        self.token_embedding = torch.nn.Embedding(VOCABULARY, width)
        self.position_embedding = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.final_norm = torch.nn.LayerNorm(width)
        self.output = torch.nn.Linear(width, VOCABULARY, bias=False)  # untied from token_embedding

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.output(self.final_norm(self.blocks(x)))


def layer_type(name):
    """What the study reports levels by: embedding, attention, mlp, output, or norm (1-D)."""
    if "embedding" in name:
        return "embedding"
    if name.startswith("output."):
        return "output"
    for kind in ("attention", "mlp"):
        if f".{kind}." in name:
            return kind
    return "norm"


def lr_factor(args, step):
    """A linear warm-up to the peak, then a cosine that would reach a tenth of it one step
    after the last."""
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, args.windows * args.steps_per_window - args.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(args, model):
    peak = args.lr or PEAK_LR[args.optimizer]
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=args.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=peak, momentum=0.9, weight_decay=args.weight_decay)


def autocast(args):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")


def validation_loss(model, batches, args):
    """Mean next-byte cross-entropy (nats) over every rank's share of the validation windows."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad(), autocast(args):
        for inputs, targets in batches:
            logits = model(inputs).float()
            total += torch.tensor([F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item(),
                                   targets.numel()], dtype=torch.float64)
    model.train()
    total = hvd.allreduce(total, op=hvd.Sum, name="validation.loss")
    return float(total[0] / total[1])


def perplexity(loss):
    """exp(loss), infinite where a diverged run's loss overflows it: the run goes on, and its
    record keeps the divergence."""
    return math.inf if loss >= math.log(sys.float_info.max) else math.exp(loss)


def check_same_data(corpus):
    """Every rank must train and validate on the same split; a rank that differs (another
    Python, another file list) would make the averaged loss meaningless."""
    digests = hvd.allgather_object(corpus.digest)
    if any(digest != corpus.digest for digest in digests):
        raise RuntimeError(f"the ranks' data differ: {digests}")


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    corpus = Corpus()
    check_same_data(corpus)
    validation = corpus.validation_batches(args.validation_sequences, args.context, hvd.rank(), hvd.size())
    model = Transformer(args.width, args.layers, args.heads, args.context)
    optimizer = hvd.DistributedOptimizer(
        make_optimizer(args, model), named_parameters=model.named_parameters(), compression=compression_of(args),
        interval=args.interval, policy=policy_of(args, total_windows=args.windows), tensorboard_dir=args.tensorboard_dir)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(args, step))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    batches = torch.Generator().manual_seed(1_000_003 * args.seed + hvd.rank())

    log = RunRecord(args.record, hvd.rank())
    log.write({"event": "config", "workers": hvd.size(), "data": corpus.digest,
           "layer_types": {name: layer_type(name) for name, _ in model.named_parameters()}, **vars(args)})
    bar = epochs_bar(args.windows, hvd.rank(), enabled=not args.no_progress)
    seconds = 0.0
    for window in bar:
        started = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        losses = torch.zeros(2, dtype=torch.float64)
        for _ in range(args.steps_per_window):
            inputs, targets = corpus.train_batch(batches, args.batch_size, args.context)
            optimizer.zero_grad()
            with autocast(args):
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        levels = optimizer.accordion_stats()["levels"]  # in force this window; the check below sets the next
        optimizer.end_epoch()
        seconds += time.perf_counter() - started
        losses = hvd.allreduce(losses, op=hvd.Sum, name="train.loss")
        loss = validation_loss(model, validation, args)
        stats = optimizer.accordion_stats()
        log.write_new_checks(stats, window)
        record = {"event": "epoch", "epoch": window, "validation_loss": round(loss, 5),
                  "perplexity": round(perplexity(loss), 4), "loss": round(float(losses[0] / losses[1]), 5),
                  "bytes_sent_per_rank": stats["total_bytes_sent"],
                  "wire_bytes_sent_per_rank": stats["total_wire_bytes_sent"], "wall_time_s": round(seconds, 3),
                  "lr": lr, "levels": levels}
        log.write(record)
        show_epoch(bar, record, validation=record["validation_loss"])
    log.finish(record, ("validation_loss", "perplexity", "bytes_sent_per_rank", "wire_bytes_sent_per_rank",
                        "wall_time_s"), args.compression,
               f"validation loss {record['validation_loss']:.4f} nats per byte")
    return record


if __name__ == "__main__":
    main(parse_args())
