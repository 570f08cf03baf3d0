"""The pieces of the GPU benchmark kit (``python -m bench.gpu``), one role a module: the machine and the
model (``kit``), the training rows (``training``), the GEMM ceiling (``ceiling``), the vision tower
(``vision``), the scorer (``scoring``), the targets (``targets``) and the page (``page``)."""
