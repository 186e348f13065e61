"""Speed and memory benchmark of every registered alignment method, next to POT.

What is timed (all float32 on CPU, ``torch.set_num_threads(threads)``):

* ``method`` rows, for every method in :data:`otviz.methods.METHODS` (iterated, so methods
  added by other modules appear too) over the grid ``N x M`` (and ``r`` for methods whose
  class sets ``uses_rank``):

  - ``forward``: the training-free configuration (identity projections: the features are
    already in the concept space, width ``d``), i.e. ``align`` from features -- cost
    matrix, solver, score, marginals, everything the method returns;
  - ``forward+backward``: the trainable configuration (projections ``d -> d_c = d``, mass
    heads, anchors), ``local_score.sum() + regulariser()`` back-propagated to the method's
    parameters (the backbone is frozen, the features need no gradient).

* ``solver`` rows on the same cost matrices: our dense unbalanced and balanced Sinkhorn
  (``L`` iterations) from the cost tensor, and POT 0.9.7 per pair
  (``ot.unbalanced.sinkhorn_unbalanced`` with ``reg_type='entropy'``, ``reg_m=(tau_v,
  tau_t)``, ``numItermax=L``, ``stopThr=0``; ``ot.sinkhorn`` (its default ``'sinkhorn'``
  method) with ``numItermax=L``, ``stopThr=0``) on numpy float32 copies, and
  ``ot.batch.solve_batch(method='log_sinkhorn', max_iter=L, tol=0)`` on the torch batch.
  POT offers no batched *unbalanced* solver, so there is no such row.

* ``shared`` rows: forward (training-free) at ``N = 196``, ``M = 48`` on batches that
  repeat images or captions, as real workloads do (:func:`shared_layouts`: a training
  step's hard-negative pairs; two-stage retrieval's 128 candidates per query). Such
  batches carry their distinct images and captions (``PairSides``), so the projections,
  and ConceptOT's anchor kernels, are formed once per image and caption; the grid rows
  above have all-distinct pairs (the worst case for ConceptOT).

* ``train_step`` rows: one training step of 64 items with ``K_h = 4`` hard negatives each
  way (64 + 2 * 64 * 4 = 576 pairs gathered with :meth:`PairBatch.index`) at the
  ViT-B/16 sizes ``N = 196``, ``M = 48``: forward + backward, trainable configuration.

Time per pair: the best (``ms_per_pair``) and the median (``ms_per_pair_median``) wall-clock
time over ``repeats`` timed runs after one warm-up, divided by the number of pairs; best-of-k
is the figure least disturbed by other processes on a shared CPU. All method rows of one
``N x M`` cell are timed together in interleaved rounds (each round runs every row once), so
the ratios between methods come from the same machine load. ``cpu_ms_per_pair`` is the
best process CPU time (all threads together; with one thread it is the figure least
affected by other processes, with two it includes time spent waiting at thread barriers).

Pairs are processed in chunks of at most ``max_elems`` per-pair-weighted elements
(``N * M + (N + M) * d`` per pair), the chunk's random features reused for every chunk;
rows record the chunk size.

Peak memory: for torch rows, the peak of live CPU tensor memory during one chunk, from the
torch profiler's memory events (``profile_memory=True``; allocations net of frees per op,
cumulated in time order; inputs allocated before the call are not counted); for POT rows,
``tracemalloc``'s peak during one pair (numpy allocations are traced). Rows say which.

Nothing is skipped silently: a method that cannot run a configuration gets a row whose
``status`` holds the error.
"""
