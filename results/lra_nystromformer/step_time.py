"""Seconds per training step of the ListOps model at lra_setting=nystromformer (batch 32 x 2,000 tokens,
one thread), each mechanism on the same batch for 3 steps (the first includes warm-up):

    OMP_NUM_THREADS=1 .venv/bin/python results/lra_nystromformer/step_time.py vanilla local_1d sparse_fixed lsh
"""

import sys
import time

import torch

from zoo.app.compose import compose
from zoo.app.run import build

torch.set_num_threads(1)
for attention in sys.argv[1:]:
    overrides = ["experiment=lra_listops", "lra_setting=nystromformer", f"attention={attention}", "logger=none"]
    _, task, model = build(compose([*overrides, "trainer.device=cpu"]))
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
    print(attention, "s/step:", [round(s, 2) for s in seconds], "params:", params, flush=True)
