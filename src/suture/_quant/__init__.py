"""Quantized checkpoints: FP8 with block scales, MXFP4, DeepSeek-V4's FP4 experts,
compressed-tensors INT and NVFP4, ModelOpt NVFP4, read dequantized; FP8 written.

`formats` holds the FP8 and MXFP4 arithmetic (numpy, per block), `e2m1` and `intpack` that
of the packed formats; `scheme` reads a ``quantization_config``; `nodes` and `grouped` are the
lazy nodes that dequantize (or quantize) as a block is read; `tensors` pairs a checkpoint's
tensors with their scales by name (``X.weight`` + ``X.weight_scale_inv`` or DeepSeek-V4's
``X.scale``, ``X_blocks`` + ``X_scales``), with `compressed` and `modelopt` doing so for those
formats' names, and builds the dequantized or quantized set; `views` tells `suture inspect` a
packed weight's logical shape and format.
"""
