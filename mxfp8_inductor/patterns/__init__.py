"""Finding and classifying routed-expert grouped matmuls in FX graphs (the compiler pass)."""
