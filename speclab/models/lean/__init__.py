"""speclab's lean forward: a Llama-family decoder run straight from a transformers model's weights.

weights.py  the weight layouts and their packing (built once per model, cached on it)
forward.py  the math: LeanLM, one sequence in a preallocated cache, any rows at any positions
static.py   StaticLM: the same math in static shapes (persistent buffers, bucketed widths, a mask
            over the whole cache), captured as CUDA graphs on a GPU
batch.py    LeanBatchLM: B sequences sharing one slot space
archs.py    what each architecture changes in the Llama forward, and whether a model is supported

models.backends chooses between these and the transformers adapter (models.hf).
"""
