"""MXFP8 numerics: the pure-torch reference (`reference`) and its Triton twins (`triton_mx`)."""
