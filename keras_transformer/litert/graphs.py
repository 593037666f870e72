"""The LiteRT export's graphs as the runtime calls them (`keras_transformer.litert.runtime`):
the encoder, the alignment pass and the decoder step, each a LiteRT interpreter whose input
shapes follow the request (resized when they change), and the step's self-attention caches held
in the interpreter's own input buffers. NumPy and the interpreter alone: no TensorFlow, no Keras.
"""

import numpy as np

from keras_transformer.litert.search import NEG_INF

# The step's shortlist inputs that may hold a row per hypothesis, `[rows, ...]`: each row's own
# biases (`output_bias`) or mask (`output_mask`), each row masked to its own shortlist.
ROW_INPUTS = ("output_bias", "output_mask")


class LiteRTError(ValueError):
    """A directory that is not a LiteRT export this version can run."""


def output_indices(interpreter, names):
    """`{name: tensor index}` of the interpreter's outputs, named in order by `names` (the
    export's metadata: the converted model keeps no output names)."""
    details = interpreter.get_output_details()
    if len(details) != len(names):
        raise LiteRTError(
            f"the LiteRT model has {len(details)} outputs, its metadata names {len(names)}"
        )
    return {name: d["index"] for name, d in zip(names, details)}


def resize(interpreter, indices, shapes):
    for name, shape in shapes.items():
        interpreter.resize_tensor_input(indices[name], shape, strict=False)
    interpreter.allocate_tensors()


class Encoder:
    """`encoder.tflite`: int32 source ids `[c, S]` -> `{cross_keys_l: [c, H, S, d], ...}`."""

    def __init__(self, interpreter, names):
        self.interpreter = interpreter
        self.input = interpreter.get_input_details()[0]["index"]
        self.outputs = output_indices(interpreter, names)
        self.shape = None

    def __call__(self, source):
        it = self.interpreter
        if self.shape != source.shape:
            resize(it, {"source_ids": self.input}, {"source_ids": source.shape})
            self.shape = source.shape
        it.set_tensor(self.input, source)
        it.invoke()
        return {name: it.get_tensor(index) for name, index in self.outputs.items()}


class Aligner:
    """`alignment.tflite`: source ids `[c, S]`, target ids `[c, T]` -> the attended source
    piece of each target piece, int32 `[c, T]`."""

    def __init__(self, interpreter):
        self.interpreter = interpreter
        self.inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        self.output = interpreter.get_output_details()[0]["index"]
        self.shapes = None

    def __call__(self, source, target):
        it, values = self.interpreter, {"source_ids": source, "target_ids": target}
        shapes = {name: value.shape for name, value in values.items()}
        if shapes != self.shapes:
            resize(it, self.inputs, shapes)
            self.shapes = shapes
        for name, value in values.items():
            it.set_tensor(self.inputs[name], value)
        it.invoke()
        return it.get_tensor(self.output)


class GatheredHead:
    """A `dynamic_int8` export's shortlist head (`export.litert.shortlist_head` `"gathered"`):
    the step's `hidden` output projected onto a chunk's shortlist columns and scored, by one
    LiteRT model made for the chunk (`keras_transformer.litert.projection`): the int8 product
    of the columns' rows (their `banned` logits) and of the banned pieces' (their `special`
    ones) in front of `shortlist_head.tflite`'s graph
    (`export.litert_graphs.gathered_head_function`).

    `head`: that graph's bytes, its outputs (`top_log_probs`, `top_ids`, `eos_log_probs`)
    named by `names`; `make_interpreter(bytes)` makes the chunk's interpreter (`start`)."""

    def __init__(self, head, names, make_interpreter):
        self.head, self.names = head, names
        self.make_interpreter = make_interpreter
        self.interpreter, self.rows = None, None

    def start(self, columns):
        """Readies the head for a chunk's `columns` (`runtime.gathered_columns`): `{"output_ids"
        [n], "products": [the columns' (rows, scales, biases), the banned pieces']}` and
        optionally `"row_bias"` float32 `[rows, n]`, added to each row's column logits (0 at
        its own shortlist, NEG_INF elsewhere: each row masked to its own columns; the
        projection model's `row_bias` input, set when the rows change, not at each step)."""
        from keras_transformer.litert.projection import projection_model

        self.interpreter = None  # the last chunk's, freed before the next is made
        self.row_bias = columns.get("row_bias")
        model = projection_model(
            columns["products"], head=self.head, row_bias=self.row_bias is not None
        )
        it = self.interpreter = self.make_interpreter(model)
        self.inputs = {d["name"]: d["index"] for d in it.get_input_details()}
        self.outputs = output_indices(it, self.names)
        self.output_ids = columns["output_ids"]
        self.rows = None  # the shapes are set at the first call

    def keep(self, rows):
        """Only these rows (indices into the current ones) go on: `row_bias` follows them."""
        if self.row_bias is not None:
            self.row_bias = self.row_bias[rows]
            self.rows = None  # set again at the next call

    def __call__(self, hidden):
        """`(top_log_probs, top_ids, eos_log_probs)` of the rows of `hidden` `[rows,
        d_model]`."""
        it = self.interpreter
        if hidden.shape[0] != self.rows:
            shapes = {"hidden": list(hidden.shape), "output_ids": [len(self.output_ids)]}
            if self.row_bias is not None:
                shapes["row_bias"] = list(self.row_bias.shape)
            resize(it, self.inputs, shapes)
            it.set_tensor(self.inputs["output_ids"], self.output_ids)
            if self.row_bias is not None:
                it.set_tensor(self.inputs["row_bias"], self.row_bias)
            self.rows = hidden.shape[0]
        it.set_tensor(self.inputs["hidden"], hidden)
        it.invoke()
        names = ("top_log_probs", "top_ids", "eos_log_probs")
        return tuple(it.get_tensor(self.outputs[name]) for name in names)


class DecoderStep:
    """`decoder_step.tflite` as the search's step (`keras_transformer.litert.search`).

    The self-attention caches are the interpreter's own input buffers, one slot per beam
    (`keras_transformer.export.litert_graphs`): each call writes the step's new keys and values
    into them through numpy views, and `reorder` only permutes `history`, which records for
    each hypothesis the slot holding its key at each position. Nothing is copied per step but
    the step's own inputs and outputs.

    With `bucket` > 0 the caches start `bucket` positions long (at most the chunk's
    `positions`) and grow when a step's position would not fit: to twice their length, or to
    `positions` where less than a bucket would be left, each slot's written positions copied
    into the longer layout (`_grow`). A chunk of 33 positions and a bucket of 16 resizes once.
    """

    def __init__(self, interpreter, meta, outputs=None, bucket=0, head=None):
        self.interpreter = interpreter
        self.inputs = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        outputs = meta["outputs"]["decoder_step"] if outputs is None else outputs
        self.outputs = output_indices(interpreter, outputs)
        self.layers, self.heads = int(meta["num_layers"]), int(meta["num_heads"])
        self.head_dim, self.beams = int(meta["head_dim"]), int(meta["decoding"]["beam_size"])
        self.shapes, self.columns, self.wanted, self.listed = None, {}, None, None
        self.bucket = int(bucket)
        self.scratch = {}  # `_scratch`'s buffers
        self.head = head  # a `GatheredHead`: the step gives its `hidden` output

    def start(self, cross, source_mask, positions, columns=None, wanted=None):
        """Readies the step for a chunk: the encoder's `cross` keys/values, the source mask
        `[c, S]` and `positions` cache positions at most (the first `bucket` of them, grown
        when needed); the caches start empty. `columns`: the shortlist step's inputs for the
        chunk, `{"output_ids", "output_kernel", "output_bias"}` or the masked step's
        `{"output_mask"}`, or a step with a `head`'s (`GatheredHead.start`); `wanted`: the
        constrained step's wanted ids per row (`W`; given to a step with `output_ids` as their
        columns)."""
        c = source_mask.shape[0]
        if self.head is not None:  # the columns are the head's, not the step's inputs
            self.head.start(columns)
            columns = None
        bias = np.where(source_mask, 0.0, NEG_INF).astype("float32")[:, None, None, :]
        values = {**cross, "cross_bias": bias, **(columns or {})}
        # The inputs fixed for the chunk, kept here: a resize sets them again from these
        # arrays, not from copies read back out of the interpreter.
        self.fixed = values
        self.columns = {name: list(np.shape(value)) for name, value in (columns or {}).items()}
        # the inputs with a row per hypothesis (each row's own shortlist): they follow the
        # live sentences as the caches do
        self.per_row = {
            name for name, shape in self.columns.items() if name in ROW_INPUTS and len(shape) == 2
        }
        self.listed = None
        if "output_ids" in self.columns:  # the shortlist's real ids, increasing: an id's column
            real = columns["output_bias"] > NEG_INF / 2
            real = real.any(axis=0) if real.ndim == 2 else real  # in some row's shortlist
            self.listed = columns["output_ids"][real]
        self.wanted = wanted
        self.limit = positions
        length = positions if self.bucket <= 0 else min(self.bucket, positions)
        self._layout(c, source_mask.shape[1], length, values)
        self.history = np.zeros((c, self.beams, length), "int32")  # the slot of each key
        self.live = np.arange(c)  # the sentences still searched (`keep`), in the batch

    def _layout(self, c, s_len, positions, values, zero_caches=True):
        """The interpreter's inputs sized for `c` sentences, `s_len` source tokens and
        `positions` cache positions, with the inputs in `values` set (resized only when a
        size changed; the self-attention caches then zeroed: never read unwritten, since
        masked, but they must be finite)."""
        k, heads, size = self.beams, self.heads, self.head_dim
        shapes = {"ids": [c * k], "position": [1], "self_bias": [c, 1, k, k * positions]}
        shapes["cross_bias"] = [c, 1, 1, s_len]
        shapes.update(self.columns)
        if self.wanted is not None:
            shapes["wanted_ids"] = [c * k, self.wanted]
        for i in range(self.layers):
            shapes[f"self_keys_{i}"] = shapes[f"self_values_{i}"] = [c, heads, k * positions, size]
            shapes[f"cross_keys_{i}"] = shapes[f"cross_values_{i}"] = [c, heads, s_len, size]
        it = self.interpreter
        if shapes != self.shapes:
            resize(it, self.inputs, shapes)
            self.shapes = shapes
            if zero_caches:
                for name in self._self_caches():
                    it.tensor(self.inputs[name])().fill(0.0)
        for name, value in values.items():
            it.set_tensor(self.inputs[name], value)
        self.rows, self.positions = c * k, positions

    def _self_caches(self):
        return [f"self_{n}_{i}" for i in range(self.layers) for n in ("keys", "values")]

    def keep(self, sentences):
        """Only `sentences` (indices into the live ones) go on. The batch is compacted to them
        once at most half of it is live (a resize costs about a step; until then the settled
        sentences' rows are computed and ignored)."""
        self.live = self.live[np.asarray(sentences, "int64")]
        if len(self.live) and len(self.live) <= self.rows // self.beams // 2:
            self._compact()

    def _compact(self):
        """The interpreter's inputs resized to the live sentences alone."""
        live, it = self.live, self.interpreter
        caches = {}
        for name in self._self_caches():
            cache = it.tensor(self.inputs[name])()
            caches[name] = cache[live]  # a copy of the live rows alone
            del cache  # no reference to the interpreter's buffers may outlive this
        k = self.beams
        rows = (live[:, None] * k + np.arange(k)).reshape(-1)

        def kept(name, value):  # the shortlist's inputs are the chunk's, but the per-row ones
            if name in self.per_row:
                return value[rows]
            return value if name in self.columns else value[live]

        self.fixed = {name: kept(name, value) for name, value in self.fixed.items()}
        for name in self.per_row:
            self.columns[name] = list(self.fixed[name].shape)
        if self.head is not None:
            self.head.keep(rows)
        s_len = self.fixed["cross_bias"].shape[-1]
        self._layout(len(live), s_len, self.positions, {**self.fixed, **caches}, zero_caches=False)
        self.history = self.history[live]
        self.live = np.arange(len(live))

    def _grow(self, index):
        """Longer caches, for a step at `index` (`index >= positions`): twice as long, or all
        `limit` positions where less than a bucket would be left; each slot's positions keep
        their keys and values, the new ones zeroed, and `history` grows alike. The written
        positions are read out once and written straight into the resized interpreter's
        buffers; the chunk's fixed inputs are set again from `self.fixed`."""
        old = self.positions
        length = max(2 * old, index + 1)
        if self.limit - length < max(self.bucket, 1):
            length = self.limit
        c, k, it = self.rows // self.beams, self.beams, self.interpreter
        shape = (c, self.heads, k, old, self.head_dim)
        written = {}
        for name in self._self_caches():
            cache = it.tensor(self.inputs[name])()
            written[name] = self._scratch(name, shape, cache.dtype)
            np.copyto(written[name], cache.reshape(shape))
            del cache  # no reference to the interpreter's buffers may outlive this
        s_len = self.fixed["cross_bias"].shape[-1]
        self._layout(c, s_len, length, self.fixed, zero_caches=False)
        for name, value in written.items():
            cache = it.tensor(self.inputs[name])()
            slots = cache.reshape(c, self.heads, k, length, self.head_dim)
            slots[:, :, :, :old] = value
            slots[:, :, :, old:] = 0.0  # never read unwritten (masked), but finite
            del cache, slots  # no reference to the interpreter's buffers may outlive this
        self.history = np.pad(self.history, ((0, 0), (0, 0), (0, length - old)))

    def _scratch(self, name, shape, dtype):
        """A buffer of `shape` for `name`'s written positions while the caches grow, kept for
        the next growth (of this chunk or the next): a fresh array of this size (megabytes at
        a served batch's shapes) costs a page fault per 4 KiB at each growth, more than the
        copy itself."""
        size = int(np.prod(shape))
        held = self.scratch.get(name)
        if held is None or held.size < size or held.dtype != dtype:
            held = self.scratch[name] = np.empty(size, dtype)
        return held[:size].reshape(shape)

    def _live_rows(self):
        k = self.beams
        return (self.live[:, None] * k + np.arange(k)).reshape(-1)

    def _self_bias(self, index):
        """`[c, 1, k, k * T]`: 0 where a hypothesis's own keys are (positions before `index`
        in the slots its history names), NEG_INF elsewhere."""
        k = self.beams
        own = self.history[:, :, None, :] == np.arange(k)[None, None, :, None]  # [c, k, k, T]
        own &= np.arange(self.positions) < index
        bias = np.where(own, np.float32(0.0), np.float32(NEG_INF))
        return bias.reshape(-1, 1, k, k * self.positions)

    def __call__(self, ids, index, wanted=None):
        if index >= self.positions:
            self._grow(index)
        it, k = self.interpreter, self.beams
        rows = self._live_rows()
        all_ids = np.zeros(self.rows, "int32")  # settled sentences' rows: computed, ignored
        all_ids[rows] = ids
        it.set_tensor(self.inputs["ids"], all_ids)
        if wanted is not None:  # the constrained step's
            all_wanted = np.zeros((self.rows, self.wanted), "int32")
            listed = self.listed is not None  # every wanted id is in the shortlist
            all_wanted[rows] = np.searchsorted(self.listed, wanted) if listed else wanted
            it.set_tensor(self.inputs["wanted_ids"], all_wanted)
        it.set_tensor(self.inputs["position"], np.array([index], "int32"))
        it.set_tensor(self.inputs["self_bias"], self._self_bias(index))
        it.invoke()
        c = self.rows // k
        for i in range(self.layers):
            for name in ("keys", "values"):
                new = it.tensor(self.outputs[f"new_{name}_{i}"])()  # [c, H, k, d], a view
                cache = it.tensor(self.inputs[f"self_{name}_{i}"])()
                cache.reshape(c, self.heads, k, self.positions, self.head_dim)[:, :, :, index] = new
                del cache, new  # no reference to the interpreter's buffers may outlive this
        self.history[:, :, index] = np.arange(k)
        if self.head is not None:
            hidden = it.get_tensor(self.outputs["hidden"])
            return tuple(output[rows] for output in self.head(hidden))
        names = ("top_log_probs", "top_ids", "eos_log_probs")
        names += () if wanted is None else ("wanted_log_probs",)
        return tuple(it.get_tensor(self.outputs[name])[rows] for name in names)

    def reorder(self, origin):
        """The live hypotheses of each sentence follow their origins (flat live rows)."""
        rows = self._live_rows()
        flat = self.history.reshape(self.rows, self.positions)
        flat[rows] = flat[rows[np.asarray(origin)]]
