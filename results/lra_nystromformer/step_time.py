"""Seconds per training step of the ListOps model at lra_setting=nystromformer (batch 32 x 2,000 tokens,
one thread), each mechanism on the same batch for 3 steps (the first includes warm-up). A mechanism may carry
':'-separated overrides, as in run_listops.sh (lsh as run there, their reformer-2, is the second line):

    OMP_NUM_THREADS=1 .venv/bin/python results/lra_nystromformer/step_time.py vanilla local_1d sparse_fixed lsh
    OMP_NUM_THREADS=1 .venv/bin/python results/lra_nystromformer/step_time.py \
        lsh:attention.n_hashes=2:attention.n_buckets=64:attention.attend_across_buckets=true:model.attention_dropout=0
"""

import sys
import time

import torch

from zoo.app.compose import compose
from zoo.app.run import build

torch.set_num_threads(1)
for run in sys.argv[1:]:
    attention, *extra = run.split(":")
    overrides = ["experiment=lra_listops", "lra_setting=nystromformer", f"attention={attention}", "logger=none"]
    _, task, model = build(compose([*overrides, *extra, "trainer.device=cpu"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = task.batch("train", 0)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        model(batch["tokens"], batch["targets"], pad_mask=batch["pad_mask"]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    print(run, "s/step:", [round(s, 2) for s in seconds], "params:", params, flush=True)
