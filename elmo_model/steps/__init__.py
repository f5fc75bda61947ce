"""The LSTM step implementations ``elmo_model.lstm_steps`` chooses from, each tested equal
to the reference step in ``elmo_model.model``: in place on the CPU (``torch_step``),
oneDNN matmuls on reordered weights (``onednn``), the fused Triton step on a GPU
(``fused_lstm``, with ``fused_graphs``)."""
