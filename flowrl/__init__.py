"""flowrl: reward post-training of diffusion and flow-matching models.

The engine (this package) treats a denoising chain as an MDP; heads, rewards and data
sources plug in through registries. See README.md and DESIGN.md.
"""
__version__ = "0.1.0"
