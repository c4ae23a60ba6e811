"""Speed and memory harness: ``python -m zoo.bench``.

For each variant (a registered attention in an LM skeleton, a preset, or a peer library's model)
and each sequence length (or depth), it measures one training step (forward + backward):

- time: median over ``--repeats`` after ``--warmup`` steps, with ``torch.set_num_threads`` fixed;
- tokens per second (batch * length / median time);
- activation memory: bytes of tensors saved for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (unique storages, parameters excluded): exact and
  noise-free on CPU;
- peak resident memory of a fresh process running one step (``--rss``; noisier, includes torch);

then fits the log-log slope of time and memory against length (the complexity claim), finds the
length from which each variant beats the baseline, and writes ``bench.csv``, ``bench.md`` and a
log-log ``bench.png`` into ``--out``.

``--paired`` instead times the variants in alternating rounds in one run (the order rotated each
round, a warm-up round unrecorded) and reports each one's median speed-up over ``--baseline`` with
its min-max over rounds: the only timing that holds on a machine whose load drifts (``paired.csv``,
``paired_rounds.csv``, ``paired.md``, ``paired.png``); ``--flops`` adds the share of the matmul FLOP
bound reached where the count is known (the Reformer). ``--device`` (auto: CUDA when present)
measures on a GPU (synchronised clocks; ``gpu_peak_mib`` = ``torch.cuda.max_memory_allocated``);
``--compile`` adds every variant under ``torch.compile`` as ``<label>+compile``; ``--precision bf16``
times every step under bf16 autocast (CUDA or CPU), ``--precision fp32,bf16`` each variant beside its
bf16 twin ``<label>+bf16`` (with ``--paired``: the bf16 speed-up per round). ``--generate`` measures
decoding instead: tokens per second and the state's MiB at each context (:mod:`zoo.bench.generate`).
``--fsdp-ranks 1,2,4`` measures the parameter and optimiser bytes per rank with the model sharded by FSDP
over that many gloo processes (:mod:`zoo.bench.sharding`).
``--kernels a,b`` times the gated linear family's chunk kernels alone beside causal SDPA and flash-linear-
attention's naive references, with the share of the matmul FLOP bound each reaches (:mod:`zoo.bench.kernels`).

Variants: ``--attention a,b`` (mechanisms in a skeleton preset), ``--model p,q`` (presets),
``--variant key=value ...`` (one variant per flag, as dotted config overrides, the app's syntax,
merged by :func:`zoo.config.merge_config`), ``--peers`` (other libraries, :data:`PEER`).
``--set key=value`` goes on top of every zoo variant. ``--imports a.b,c.d`` imports your own modules
first (:func:`zoo.registry.import_plugins`), so the parts they register can be measured by name. Examples::

    python -m zoo.bench --attention vanilla --lengths 256,512,1024
    python -m zoo.bench --attention vanilla --variant attention=lsh attention.n_hashes=4 --lengths 1024,4096 \
        --peers reformer-pytorch
    python -m zoo.bench --model reformer,vanilla_lm --layers 2,4,8,12 --lengths 1024 --set residual=pre_norm
    python -m zoo.bench --model reformer --variant model=reformer stack=sequential --layers 2,4,8 --lengths 1024
    python -m zoo.bench --imports my_research.attention --attention vanilla,my_attention --lengths 1024
    python -m zoo.bench --paired --flops --model reformer,vanilla_lm --peers reformer-pytorch \
        --baseline peer:reformer-pytorch --lengths 8192 --rounds 5
    python -m zoo.bench --kernels deltanet,gated_deltanet,mamba2,retention,gla --lengths 1024,4096,16384 \
        --rounds 3 --threads 1 --out results/kernels
    python -m zoo.bench --generate --attention vanilla,local_1d,sparse_fixed --variant attention=lsh \
        attention.n_buckets=64 --lengths 1024,4096,16384,65536 --new-tokens 16 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from zoo.bench.generate import run_generate, write_generate
from zoo.bench.kernels import run_kernels, write_kernels
from zoo.bench.machine import describe_machine, load_average
from zoo.bench.measure import rss_child, run, run_paired
from zoo.bench.report import write_csv, write_outputs, write_paired
from zoo.bench.sharding import fsdp_bytes, fsdp_table
from zoo.bench.timing import pick_device
from zoo.bench.variants import add_variant_arguments, parse_set, variants_from_args
from zoo.precision import check_precision
from zoo.registry import import_plugins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zoo.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_variant_arguments(parser)
    parser.add_argument(
        "--imports",
        default="",
        help="comma-separated modules of your own to import first (e.g. my_research.attention): the parts "
        "they register can then be named in --attention, --model, --variant and --set",
    )
    parser.add_argument("--lengths", default="256,512,1024", help="comma-separated sequence lengths")
    parser.add_argument(
        "--layers", default="2", help="comma-separated depths (several with one length = a depth sweep)"
    )
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=0, help="feed-forward width (default 4 * d_model)")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument(
        "--batch", default="1", help="sequences per step; --generate takes several (1,8): each context at each batch"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override on top of every zoo variant, e.g. residual=pre_norm or attention.n_hashes=4",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto (cuda when present, else cpu), cpu, cuda or cuda:N")
    parser.add_argument(
        "--paired",
        action="store_true",
        help="alternating rounds in one run: every round times one step of each variant, in an order "
        "rotated each round, after a warm-up round; reports the median speed-up over --baseline "
        "with its min-max over rounds (paired.csv, paired_rounds.csv, paired.md, paired.png)",
    )
    parser.add_argument(
        "--generate",
        action="store_true",
        help="decoding instead of training: at each --lengths context, prefill once through the state, then "
        "time --new-tokens greedy tokens one at a time in alternating rounds; tokens/s and the state's MiB "
        "(generate.csv, generate_rounds.csv, generate.md, generate.png)",
    )
    parser.add_argument(
        "--kernels",
        default="",
        help="comma-separated chunk-kernel mechanisms (deltanet, gated_deltanet, mamba2, retention, gla): each "
        "kernel's training step alone beside causal SDPA and fla's naive reference ($ZOO_REFERENCES), with the "
        "share of the matmul FLOP bound (kernels.csv, kernels_rounds.csv, kernels.md)",
    )
    parser.add_argument("--no-naive", action="store_true", help="--kernels: leave out fla's naive references")
    parser.add_argument("--new-tokens", type=int, default=16, help="--generate: tokens decoded per round")
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=4096,
        help="--generate: prompt tokens per call of the prefill (0 = one call)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--paired / --generate: recorded rounds")
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="--paired: time one forward in eval mode under no_grad (evaluation's cost; FlexAttention's only path on "
        "a CPU) instead of a training step",
    )
    parser.add_argument(
        "--flops",
        action="store_true",
        help="--paired: the share of the matmul FLOP bound each step reaches, where the count is "
        "known (the Reformer: LSH attention in a reversible stack), against a matmul probe "
        "timed each round",
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed steps per point (0: activation memory and RSS only, no timing)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="a step slower than this is measured once and the variant skips larger points",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="variant label the crossover (or --paired's speed-up) is measured against (default: the first)",
    )
    parser.add_argument(
        "--fsdp-ranks",
        default="",
        metavar="1,2,4",
        help="memory instead of time: the parameter and optimiser bytes each rank holds with the model sharded "
        "by FSDP (trainer.fsdp) over each number of gloo processes, at the first --lengths and --layers "
        "(fsdp.csv, fsdp.md; zoo/bench/sharding.py)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the fresh-process peak RSS measurement")
    parser.add_argument("--title", default=None)
    parser.add_argument("--out", default="results/bench", help="output folder for bench.csv, bench.md, bench.png")
    parser.add_argument("--_rss-child", dest="rss_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child)
        return 0

    imports = [name.strip() for name in args.imports.split(",") if name.strip()]
    if args.kernels:
        return kernels_main(args, argv)
    try:
        import_plugins(imports)
        variants = variants_from_args(args)
        overrides = parse_set(args.set)
        device = pick_device(args.device)
        for precision in dict.fromkeys(v.precision for v in variants):
            check_precision(precision, device, key="--precision")
    except (ValueError, ImportError) as error:  # a bad name, item, module or device: the message says which
        parser.error(str(error))
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    layers = [int(x) for x in args.layers.split(",") if x.strip()]
    batches = [int(x) for x in str(args.batch).split(",") if x.strip()]
    if len(batches) != 1 and not args.generate:
        parser.error(f"--batch takes one value except with --generate; got {args.batch}")
    command = "python -m zoo.bench " + " ".join(_quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    meta = dict(
        title=args.title or "zoo.bench: one training step",
        command=command,
        machine=describe_machine(),
        torch=torch.__version__,
        threads=args.threads,
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        vocab=args.vocab,
        device=str(device),
        precision=args.precision,
    )
    sizes = dict(
        d_model=args.d_model,
        heads=args.heads,
        vocab=args.vocab,
        batch=batches[0],
        d_ff=args.d_ff or None,
        overrides=overrides,
        threads=args.threads,
        device=device,
    )
    if args.fsdp_ranks:
        ranks = [int(x) for x in args.fsdp_ranks.split(",") if x.strip()]
        meta.update(title=args.title or "zoo.bench --fsdp-ranks: bytes per rank under FSDP", load_before=load_average())
        shape = dict(vocab=args.vocab, d_model=args.d_model, heads=args.heads, layers=layers[0], batch=args.batch)
        try:
            rows = fsdp_bytes(
                variants,
                ranks,
                length=lengths[0],
                shape={**shape, "d_ff": args.d_ff or 4 * args.d_model},
                overrides=overrides,
            )
        except ValueError as error:
            parser.error(str(error))
        meta.update(load=load_average())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "fsdp.csv", rows)
        (out / "fsdp.md").write_text(fsdp_table(rows, meta))
        print((out / "fsdp.md").read_text())
        print(f"wrote {out / 'fsdp.csv'}, {out / 'fsdp.md'}")
        return 0
    if args.generate:
        if len(layers) != 1 or args.rounds < 1 or args.new_tokens < 1:
            parser.error(f"--generate needs one --layers value, --rounds >= 1 and --new-tokens >= 1; got {args.layers}")
        meta.update(title=args.title, layers=layers[0], new_tokens=args.new_tokens, load_before=load_average())
        round_rows, summary = [], []
        for batch in batches:
            rounds_b, summary_b = run_generate(
                variants,
                lengths,
                new_tokens=args.new_tokens,
                rounds=args.rounds,
                layers=layers[0],
                max_seconds=args.max_seconds,
                prefill_chunk=args.prefill_chunk,
                **{**sizes, "batch": batch},
            )
            round_rows, summary = round_rows + rounds_b, summary + summary_b
        meta.update(load=load_average())
        paths = write_generate(round_rows, summary, Path(args.out), meta)
        print(paths["md"].read_text())
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
        return 0
    if args.paired:
        labels = [v.label for v in variants]
        baseline = args.baseline or labels[0]
        if baseline not in labels or len(layers) != 1 or args.rounds < 1:
            parser.error(
                f"--paired needs one --layers value, --rounds >= 1 and --baseline among the variants "
                f"({', '.join(labels)}); got --layers {args.layers}, --rounds {args.rounds}, "
                f"--baseline {baseline}"
            )
        round_rows, summary = run_paired(
            variants,
            lengths,
            baseline,
            rounds=args.rounds,
            layers=layers[0],
            flops=args.flops,
            forward_only=args.forward_only,
            **sizes,
        )
        meta.update(title=args.title, layers=layers[0], load=load_average())
        paths = write_paired(round_rows, summary, Path(args.out), meta)
        print(paths["md"].read_text())
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
        return 0
    rows = run(
        variants,
        lengths,
        layers=layers,
        warmup=args.warmup,
        repeats=args.repeats,
        max_seconds=args.max_seconds,
        rss=not args.no_rss,
        imports=imports,
        **sizes,
    )
    paths = write_outputs(rows, Path(args.out), meta, args.baseline)
    print(paths["md"].read_text())
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")
    return 0


def kernels_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--kernels``: the chunk kernels alone (zoo.bench.kernels)."""
    import_plugins([name.strip() for name in args.imports.split(",") if name.strip()])
    names = [n.strip() for n in args.kernels.split(",") if n.strip()]
    batches = [int(x) for x in str(args.batch).split(",") if x.strip()]
    command = "python -m zoo.bench " + " ".join(_quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    meta = dict(
        command=command,
        machine=describe_machine(),
        torch=torch.__version__,
        threads=args.threads,
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        load_before=load_average(),
    )
    round_rows, summary = run_kernels(
        names,
        [int(x) for x in args.lengths.split(",") if x.strip()],
        rounds=args.rounds,
        d_model=args.d_model,
        heads=args.heads,
        batch=batches[0],
        d_ff=args.d_ff or None,
        threads=args.threads,
        max_seconds=args.max_seconds,
        naive=not args.no_naive,
    )
    meta.update(load=load_average())
    paths = write_kernels(round_rows, summary, Path(args.out), meta)
    print(paths["md"].read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " ()[]{}*;") else arg
