"""Quantized checkpoints: FP8 with block scales and MXFP4, read dequantized, FP8 written.

`formats` holds the arithmetic (numpy, per block); `scheme` reads a ``quantization_config``;
`nodes` are the lazy nodes that dequantize or quantize as a block is read; `tensors` pairs a
checkpoint's tensors with their scales by name (``X.weight`` + ``X.weight_scale_inv``,
``X_blocks`` + ``X_scales``) and builds the dequantized or quantized set.
"""
