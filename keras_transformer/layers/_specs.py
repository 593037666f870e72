"""Output specs that agree with `call` by construction. Private: a mixin of the public layers."""

import keras
from keras import tree


class CallTracedSpec:
    """Mixin: `compute_output_spec` traces `call` on symbolic inputs (Keras's default for a
    layer without `compute_output_shape`), after the conversions `__call__` itself makes:
    arrays and tensors become `KerasTensor`s and floating inputs are cast to the compute dtype.

    So the spec has `call`'s structure, shapes and dtypes for any inputs (arrays, tensors,
    `KerasTensor`s), any call arguments and any dtype policy, whatever `compute_output_shape`
    (the shape-only API, for the default call) says.
    """

    def compute_output_spec(self, *args, **kwargs):
        def symbolic(x):
            x = self.dtype_policy.convert_input(x, self.autocast, self.input_dtype)
            if keras.ops.is_tensor(x):
                return keras.KerasTensor(x.shape, x.dtype)
            return x

        args, kwargs = tree.map_structure(symbolic, (args, kwargs), none_is_leaf=True)
        return keras.Operation.compute_output_spec(self, *args, **kwargs)
