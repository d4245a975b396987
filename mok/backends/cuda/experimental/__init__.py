"""Opt-in GEMM variants that give the default's bits but were slower on every GPU measured
(docs/grouped-gemm.md): kept to be measured again on new GPUs, off unless their switch is set.

| module          | switch                | what                                                  |
|-----------------|-----------------------|-------------------------------------------------------|
| f16_rows        | MOK_MXFP8_F16=1       | MXFP8 gate/up GEMM on f16 rows rebased per row        |
| swiglu_epilogue | MOK_SWIGLU_EPILOGUE=1 | BF16 gate/up GEMM with SwiGLU in its epilogue         |
"""
