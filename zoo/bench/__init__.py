"""Speed and memory of one training step, ours beside other libraries': ``python -m zoo.bench``.

- :mod:`zoo.bench.timing`: the one timing core (timed steps, paired alternating rounds and their
  ratios, activation bytes, device pick), also used by the LRA Table 2 timing and the experiment scripts;
- :mod:`zoo.bench.variants`: what is measured (a preset with overrides, or a peer) and its step;
- :mod:`zoo.bench.peers`: the peer libraries (:data:`PEER`) and reference checkouts;
- :mod:`zoo.bench.flops`: FLOP models of a step, where one is known;
- :mod:`zoo.bench.measure`: the sweeps (timed repeats, paired rounds, fresh-process RSS);
- :mod:`zoo.bench.generate`: decoding through the state (``--generate``): tokens/s and cache MiB by context;
- :mod:`zoo.bench.report`: markdown, plots, CSV, slopes and crossovers;
- :mod:`zoo.bench.machine`: the machine and its load, in words;
- :mod:`zoo.bench.cli`: the command line (every flag: ``python -m zoo.bench --help``).
"""

from zoo.bench.cli import main
from zoo.bench.flops import reformer_step_flops, step_flops
from zoo.bench.generate import run_generate, state_bytes, write_generate
from zoo.bench.machine import describe_machine, load_average
from zoo.bench.measure import measure_rss, run, run_paired
from zoo.bench.peers import PEER, import_checkout
from zoo.bench.report import (
    crossover,
    fit_slope,
    markdown,
    paired_markdown,
    summarise,
    write_csv,
    write_outputs,
    write_paired,
)
from zoo.bench.timing import (
    ActivationMeter,
    activation_bytes,
    clocked,
    matmul_probe,
    paired_ratios,
    paired_rounds,
    pick_device,
    rotation,
    time_steps,
    timed_step,
)
from zoo.bench.variants import (
    Variant,
    add_variant_arguments,
    bench_tokens,
    build,
    named_variant,
    names,
    parse_set,
    peer_variant,
    split_batch,
    variants_from_args,
)

__all__ = [
    "run_generate",
    "state_bytes",
    "write_generate",
    "PEER",
    "ActivationMeter",
    "Variant",
    "activation_bytes",
    "add_variant_arguments",
    "bench_tokens",
    "build",
    "clocked",
    "crossover",
    "describe_machine",
    "fit_slope",
    "import_checkout",
    "load_average",
    "main",
    "markdown",
    "matmul_probe",
    "measure_rss",
    "named_variant",
    "names",
    "paired_markdown",
    "paired_ratios",
    "paired_rounds",
    "parse_set",
    "peer_variant",
    "pick_device",
    "reformer_step_flops",
    "rotation",
    "run",
    "run_paired",
    "split_batch",
    "step_flops",
    "summarise",
    "time_steps",
    "timed_step",
    "variants_from_args",
    "write_csv",
    "write_outputs",
    "write_paired",
]
