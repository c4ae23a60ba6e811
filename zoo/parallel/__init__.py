"""Context (sequence) parallelism on ``torch.distributed``: the ranks of a context group share every
sequence, each holding a chunk of it, and each attention layer exchanges only what its pattern reads.

``chunk.py``: where a rank's tokens sit in the sequence (:class:`~zoo.parallel.chunk.Layout`,
contiguous or zigzag) and what a mechanism may ask of the other ranks while the split is active
(:class:`~zoo.parallel.chunk.Chunk`: the keys of earlier chunks it reads, the tail of the sequence for
the next segment's memory, ring attention). ``exchange.py``: point-to-point sends that carry autograd
(gradients return to the ranks that sent the keys). ``ring.py``: ring attention (Liu et al. 2023).
``context.py``: :class:`~zoo.parallel.context.ContextParallel`, the model wrapper a training loop uses
(the trainer's ``trainer.context_parallel=N``), and :func:`~zoo.parallel.context.context_mesh`.

Each mechanism answers for itself (``Attention.context_refusal`` / ``attend_chunk``, in its own file);
nothing here switches on a registry name.
"""
