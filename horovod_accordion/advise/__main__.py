"""``python -m horovod_accordion.advise``: will compression make my training faster?

    python -m horovod_accordion.advise --model resnet18-cifar --workers 4,16,64 --link 10gbit,100gbit
    python -m horovod_accordion.advise --profile my_profile.json \\
        --workers 4,16,64 --link 10gbit,100gbit          # offline, from a profile saved with --save-profile
    python -m horovod_accordion.advise --model mypackage.models:make_model --input-shape 3,224,224 --batch 32
    python -m horovod_accordion.advise --model resnet18-cifar --layout hsdp --shards 8 --fast-link 400gbit \\
        --workers 2,4 --link 25gbit                  # FSDP2 hybrid sharding: the workers are replicas
"""

import argparse
import importlib
import json
import shlex
import sys

from horovod_accordion.advise.hsdp import hsdp_layout, predict_hsdp
from horovod_accordion.advise.predict import MissingExchange, low_fraction_from_study, predict, unreliable_times
from horovod_accordion.advise.report import plot, table, trust_warning, verdicts
from horovod_accordion.advise.variants import LAYOUTS, parse_variant
from horovod_accordion.advise.wire import parse_link

DEFAULT_COMPRESSIONS = "none,fp16,powersgd:1,powersgd:4,topk:0.01,accordion:powersgd:4/1"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The examples above as written, and each option's default where it has one."""

    def _get_help_string(self, action):
        if action.default is None or action.default == [] or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _integers(what, example):
    """An argparse type: positive integers separated by commas, ``what`` and ``example`` in its error."""
    def parse(text):
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"{what} are positive integers separated by commas, e.g. {example}; "
                                             f"got {text!r}")
        return values
    return parse


def _positive(text):
    """An argparse type: one positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, got {text!r}")
    return value


def _threads(text):
    """An argparse type: a positive number of threads, or 0 for torch's own choice."""
    return 0 if text.strip() == "0" else _positive(text)


def _compressions(text):
    try:
        return [parse_variant(name) for name in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _links(text):
    """The link names, each checked; ``main`` builds them with the latency and sharing."""
    try:
        return [parse_link(name).name for name in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _link(text):
    """One link's name, checked."""
    try:
        return parse_link(text).name
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _low_fraction(text):
    if text.startswith("study:"):
        return text
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction <= 1:
        raise argparse.ArgumentTypeError(f"a fraction between 0 and 1 (e.g. 0.3) or study:PATH/summary.json, "
                                         f"got {text!r}")
    return text


def _saved_profile(parser, path):
    try:
        with open(path) as stream:
            return json.load(stream)
    except (OSError, ValueError) as error:
        parser.error(f"argument --profile: cannot read a profile from {path!r}: {error}")


def _profile(parser, args, variants, workers, layouts):
    """Measure the model on this device (the only path that imports torch)."""
    import torch

    from horovod_accordion.advise.models import KNOWN
    from horovod_accordion.advise.profile import profile_model

    if args.model in KNOWN:
        factory, shape, batch = KNOWN[args.model]
    elif ":" in args.model:
        module, _, function = args.model.partition(":")
        try:
            factory, shape, batch = getattr(importlib.import_module(module), function), None, None
        except (ImportError, AttributeError) as error:
            parser.error(f"argument --model: cannot import {args.model!r}: {error}")
    else:
        parser.error(f"argument --model: one of {sorted(KNOWN)} or an importable factory module:function, "
                     f"got {args.model!r}")
    shape = tuple(args.input_shape) if args.input_shape else shape
    batch = args.batch or batch
    if shape is None or batch is None:
        parser.error("a model factory needs --input-shape (one sample, e.g. 3,224,224) and --batch")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = factory().to(device)
    inputs = torch.randn(batch, *shape, device=device)
    classes = model(inputs[:1]).shape[-1]
    targets = torch.randint(0, classes, (batch,), device=device)
    description = {"model": args.model, "input_shape": list(shape), "batch": batch,
                   "command": "python -m horovod_accordion.advise " + " ".join(sys.argv[1:])}
    return profile_model(model, inputs, targets, variants, sorted(set(workers + args.profile_workers)),
                         layouts=layouts, repeats=args.repeats, description=description)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m horovod_accordion.advise", description=__doc__,
                                     formatter_class=_HelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="resnet18-cifar, or a factory module:function (with --input-shape, --batch)")
    source.add_argument("--profile", help="predict offline from this saved JSON profile")
    parser.add_argument("--input-shape", type=_integers("a sample's dimensions", "3,224,224"),
                        help="one sample's shape, e.g. 3,32,32")
    parser.add_argument("--batch", type=_positive, help="batch per worker")
    parser.add_argument("--device", default="cpu", help="where to profile: cpu or cuda")
    parser.add_argument("--threads", type=_threads, default=1,
                        help="torch threads while profiling; 0: torch's own (a thread per core), whose timings "
                             "spread on a machine that other work shares")
    parser.add_argument("--repeats", type=_positive, default=5, help="timed repeats of everything measured")
    parser.add_argument("--save-profile", help="write the measured profile here")
    parser.add_argument("--profile-workers", type=_integers("world sizes", "2,8"), default=[],
                        help="more world sizes to record in a saved profile")
    parser.add_argument("--compressions", type=_compressions, default=DEFAULT_COMPRESSIONS,
                        help="none, fp16, powersgd:R, topk:F, quantized:B, accordion:powersgd:LOW/HIGH, "
                             "accordion:topk:LOW/HIGH, accordion:quantized:LOW/HIGH")
    parser.add_argument("--workers", type=_integers("world sizes", "4,16,64"), default="8,64,256",
                        help="the world sizes to predict (hsdp: replicas)")
    parser.add_argument("--link", type=_links, default="10gbit,25gbit,100gbit,400gbit",
                        help="per-rank link rates, e.g. 10gbit,100mbit")
    parser.add_argument("--latency-us", type=float, default=5.0, help="latency per hop (α), microseconds")
    parser.add_argument("--shared-by", type=_positive,
                        help="ranks sharing one link: 1 on a switched network (the default); with --layout hsdp, "
                             "--shards (every replica group of a node crosses its one link at once)")
    parser.add_argument("--algorithm", choices=["ring", "tree"], default="ring",
                        help="allreduce algorithm; tree: NCCL's, with 2·log2(W) latency steps")
    parser.add_argument("--layout", choices=LAYOUTS + ("hsdp",), default="horovod",
                        help="our Horovod optimizer's buckets, DDP's (our DDP hook), or FSDP2's hybrid sharding "
                             "(horovod_accordion.fsdp: --workers are then replicas, of --shards ranks each)")
    parser.add_argument("--shards", type=_positive,
                        help="with --layout hsdp, required: the ranks of a replica (a node's GPUs, e.g. 8)")
    parser.add_argument("--fast-link", type=_link, default="400gbit",
                        help="hsdp: the link inside a replica, for FSDP's all-gathers and reduce-scatters")
    parser.add_argument("--low-fraction", type=_low_fraction, default="0.5",
                        help="Accordion's fraction of steps at ℓ_low: a number, or study:PATH/summary.json")
    parser.add_argument("--check-every", type=_positive, default=1, help="steps per Accordion check (window_steps·interval)")
    parser.add_argument("--png", default="advise.png", help="where to write the speedup plot")
    args = parser.parse_args(argv)
    if args.layout == "hsdp" and args.shards is None:
        parser.error("argument --shards: --layout hsdp needs it: the ranks of one replica (a node's GPUs, "
                     "e.g. --shards 8)")
    if args.layout != "hsdp" and args.shards is not None:
        parser.error(f"argument --shards: it is for --layout hsdp, not --layout {args.layout}")

    variants = args.compressions
    names = [v.name for v in variants]
    if "none" not in names:
        variants.insert(0, parse_variant("none"))
        names.insert(0, "none")
    shared_by = args.shared_by or (args.shards if args.layout == "hsdp" else 1)
    links = [parse_link(name, args.latency_us * 1e-6, shared_by) for name in args.link]
    layout = hsdp_layout(args.shards) if args.layout == "hsdp" else args.layout
    fast_link = parse_link(args.fast_link, args.latency_us * 1e-6)
    if args.profile:
        profile = _saved_profile(parser, args.profile)
    else:
        profile = _profile(parser, args, variants, args.workers, LAYOUTS + ((layout,) if args.layout == "hsdp" else ()))
        if args.save_profile:
            with open(args.save_profile, "w") as stream:
                json.dump(profile, stream, indent=1)
    results = {}
    for variant in variants:
        fraction = 0.0
        if variant.adaptive:
            family = type(variant.compression).__name__.lower()
            try:
                fraction = low_fraction_from_study(args.low_fraction.removeprefix("study:"), family) \
                    if args.low_fraction.startswith("study:") else float(args.low_fraction)
            except (OSError, ValueError, KeyError) as error:
                parser.error(f"argument --low-fraction: {error}")
        for link in links:
            for w in args.workers:
                try:
                    results[(link.name, w, variant.name)] = predict_hsdp(
                        profile, variant.name, args.shards, w, fast_link, link, fraction, args.check_every) \
                        if args.layout == "hsdp" else predict(
                        profile, variant.name, layout, w, link, args.algorithm, fraction, args.check_every)
                except MissingExchange as missing:
                    raise SystemExit(_profile_again(missing, profile, args)) from None
    arrangement = f"hybrid sharding, {args.shards} shards per replica on {fast_link.name}, the workers are " \
        f"replicas, each link shared by {shared_by}; ring collectives, one unit per layer" \
        if args.layout == "hsdp" else f"{args.algorithm} collectives, {args.layout} buckets"
    print(f"{profile.get('model')} on {profile.get('device')} ({profile.get('threads')} threads), batch "
          f"{profile.get('batch')} per worker; {arrangement}; milliseconds per step, the range from the profile's "
          f"spread")
    warning = trust_warning(unreliable_times(profile, names, layout, args.workers))
    if warning:
        print("\n".join(warning) + "\n")  # before any verdict, which it puts in doubt
    print(table(results, args.workers, links, names))
    print()
    print("\n".join(verdicts(results, args.workers, links, names)))
    written = plot(results, args.workers, links, names, args.png, warning=warning)
    print(f"wrote {written}" if written else
          "no picture: matplotlib is not installed; pip install matplotlib (or the wheel file's plot extra, "
          "pip install 'horovod_accordion-<version>-py3-none-any.whl[plot]') to draw it")


def _profile_again(missing, profile, args):
    """What ``missing`` lacks, and the command that profiles it with the saved profile's model,
    batch, device and threads, keeping the compressions and world sizes it has, into the same file."""
    profiled = {int(w) for layouts in profile["exchanges"].values() for sizes in layouts.values() for w in sizes}
    command = ["python", "-m", "horovod_accordion.advise", "--model", str(profile.get("model")),
               "--input-shape", ",".join(map(str, profile.get("input_shape", []))), "--batch", str(profile.get("batch")),
               "--device", "cpu" if profile.get("device") == "cpu" else "cuda",
               "--threads", str(profile.get("threads", 1)), "--repeats", str(profile.get("repeats", 5)),
               "--compressions", ",".join(dict.fromkeys([v.name for v in args.compressions] + list(profile["exchanges"]))),
               "--workers", ",".join(map(str, args.workers)),
               *(["--profile-workers", ",".join(map(str, sorted(profiled - set(args.workers))))]
                 if profiled - set(args.workers) else []),
               *(["--layout", "hsdp", "--shards", str(args.shards)] if args.layout == "hsdp" else []),
               "--save-profile", args.profile]
    return (f"{missing.args[0]}.\nProfile again, on the machine the profile was taken on (this rewrites "
            f"{args.profile} with the compressions and world sizes it has and those missing), then run your "
            f"command again:\n"
            f"  {shlex.join(command)}")


if __name__ == "__main__":
    main()
