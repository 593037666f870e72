"""The one training run, the same on either backend (`outline.train`): its set-up, `fit` with its
callbacks, and its end. What differs between the backends is the engine's (`training.engines`).
"""
