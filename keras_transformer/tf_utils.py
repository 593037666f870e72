"""Small TensorFlow-only helpers shared by the layers and the training code."""


def in_xla_context():
    """True while tracing a function XLA will compile (`jit_compile=True`).

    Only meaningful on the TensorFlow backend. Fast paths built on ops XLA lacks (`InplaceSub`,
    `InplaceUpdate`) check it and fall back to their XLA-friendly forms.
    """
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # internal modules moved: assume XLA, whose fallbacks are always correct
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
