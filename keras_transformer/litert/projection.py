"""The int8 projection onto a batch's shortlist columns, a LiteRT model made at run time.

A `dynamic_int8` export's step projects with a fully-connected layer whose int8 weights are
constants of the model: XNNPACK packs them once, when the interpreter is made, so a graph
input cannot take their place, and the step's own product of the whole vocabulary can only be
masked. A shortlist's columns change with each batch; so, once per batch, the runtime writes a
model holding them: `FULLY_CONNECTED` with float32 `hidden [rows, d_model]` in,
the columns' int8 rows `[n, d_model]` (one scale per row, as the converter quantizes the step's
projection, `export.litert_graphs.quantized_rows`) and their float32 biases as its constant
weights, activations quantized per row at run time (asymmetric, as the converter's layers),
and float32 `logits [rows, n]` out. It is the same int8 product as the step's, of `n` columns
instead of the vocabulary (one more product per set of columns asked: the gathered head also
takes the banned pieces' own logits, `keras_transformer.litert.graphs.GatheredHead`). The
model is written with LiteRT's own flatbuffer schema (`ai_edge_litert.schema_py_generated`)
and run by the LiteRT interpreter like the export's graphs.
"""

import numpy as np

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
DESCRIPTION = "keras_transformer shortlist projection"


def projection_model(products, head=None, row_bias=False):
    """The LiteRT model's bytes (module docstring) for `products`, a list of `(rows, scales,
    bias)`: int8 `rows` `[n, d_model]`, their float32 `scales` `[n]` and float32 `bias` `[n]`
    (or None). Input `hidden` float32 `[-1, d_model]`; one output per product, in order,
    `logits_{i}` float32 `[-1, n]`: `hidden[r] . rows[j] * scales[j] + bias[j]`, to the
    rounding of `hidden[r]`'s int8 quantization.

    `head`: the bytes of a LiteRT model whose first inputs take the products' logits, in order
    (the gathered head's graph, `export.litert_graphs.gathered_head_function`): the products
    are written in front of its operations, feeding those inputs, so the model's inputs are
    `hidden` and the head's others, and its outputs the head's (one interpreter, the logits
    never copied out).

    `row_bias`: the first product's logits also take an input `row_bias` float32 `[-1, n]`
    (one `ADD`; the model's second input, after `hidden`): each row's own biases, NEG_INF at
    the columns outside its own shortlist (a batch's rows each masked to their own)."""
    import flatbuffers

    if not products:
        raise ValueError("no products")
    writer = _Writer(head)
    if head is not None and len(writer.inputs) < len(products):
        raise ValueError(f"the head takes {len(writer.inputs)} inputs, fewer than the products")
    width = np.shape(products[0][0])[-1]
    hidden = writer.tensor("hidden", [-1, width], "FLOAT32")
    operators, outputs, extra = [], [], []
    for i, product in enumerate(products):
        output = None if head is None else writer.inputs[i]
        if i == 0 and row_bias:  # the product into a tensor of its own, then the ADD
            n = np.shape(product[0])[0]
            bias = writer.tensor("row_bias", [-1, n], "FLOAT32")
            product_op = writer.fully_connected(i, hidden, *product, width)
            operators.append(product_op)
            added = writer.add(int(product_op.outputs[0]), bias, output, n)
            operators.append(added)
            outputs.append(int(added.outputs[0]))
            extra.append(bias)
            continue
        operators.append(writer.fully_connected(i, hidden, *product, width, output))
        outputs.append(int(operators[-1].outputs[0]))
    graph = writer.graph
    graph.operators = operators + list(graph.operators or [])  # the products first
    graph.inputs = np.array([hidden, *extra, *writer.inputs[len(products) :]], np.int32)
    if head is None:
        graph.outputs = np.array(outputs, np.int32)
    size = sum(b.data.size for b in writer.model.buffers if b.data is not None)
    builder = flatbuffers.Builder(size + 65536)
    builder.Finish(writer.model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


class _Writer:
    """A LiteRT model being written (LiteRT's object API): a new one, or `head`'s bytes
    unpacked (`inputs`: its graph's inputs)."""

    def __init__(self, head=None):
        from ai_edge_litert import schema_py_generated as schema

        self.schema = schema
        if head is None:
            model = schema.ModelT()
            model.version, model.description = SCHEMA_VERSION, DESCRIPTION
            model.operatorCodes, model.buffers = [], [schema.BufferT()]  # 0: the empty one
            graph = schema.SubGraphT()
            graph.name, graph.tensors, graph.operators = "projection", [], []
            model.subgraphs = [graph]
        else:
            model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(head, 0))
        self.model, self.graph = model, model.subgraphs[0]
        self.inputs = [] if head is None else [int(i) for i in self.graph.inputs]

    def tensor(self, name, shape, kind, data=None, quantization=None):
        """A new tensor's index (`shape`'s -1: a size given at run time), its data `data`."""
        schema, buffers = self.schema, self.model.buffers
        t = schema.TensorT()
        t.name, t.type, t.quantization = name, getattr(schema.TensorType, kind), quantization
        t.shape = np.array([max(size, 1) for size in shape], np.int32)
        t.shapeSignature = np.array(shape, np.int32)
        t.buffer = len(buffers)
        buffers.append(schema.BufferT())
        if data is not None:
            buffers[-1].data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.graph.tensors.append(t)
        return len(self.graph.tensors) - 1

    def _opcode(self, builtin):
        codes = self.model.operatorCodes
        for index, code in enumerate(codes):
            if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
                return index
        code = self.schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = builtin
        code.version = 1
        codes.append(code)
        return len(codes) - 1

    def add(self, x, y, output, n):
        """An `ADD` operator of the tensors `x` and `y` into `output` (None: a new tensor
        `[-1, n]`)."""
        schema = self.schema
        if output is None:
            output = self.tensor("biased_logits", [-1, n], "FLOAT32")
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(schema.BuiltinOperator.ADD)
        op.inputs, op.outputs = np.array([x, y], np.int32), np.array([output], np.int32)
        op.builtinOptionsType = schema.BuiltinOptions.AddOptions
        op.builtinOptions = schema.AddOptionsT()
        return op

    def fully_connected(self, i, hidden, rows, scales, bias, width, output=None):
        """The product `i`'s `FULLY_CONNECTED` operator (its tensors added): `hidden` times the
        int8 `rows` (per-row `scales`) plus `bias`, into `output` (None: a new tensor)."""
        schema = self.schema
        rows, scales = np.asarray(rows), np.asarray(scales, np.float32)
        if rows.dtype != np.int8 or rows.ndim != 2 or scales.shape != rows.shape[:1]:
            got = f"{rows.dtype} {rows.shape} and {scales.shape}"
            raise ValueError(f"int8 rows [n, d] and scales [n], got {got}")
        if rows.shape[1] != width:
            raise ValueError(f"every product's rows must be {width} wide, got {rows.shape}")
        n = rows.shape[0]
        weights = schema.QuantizationParametersT()
        weights.scale, weights.zeroPoint = scales, np.zeros(n, np.int64)
        weights.quantizedDimension = 0  # one scale per output row
        inputs = [hidden, self.tensor(f"rows_{i}", [n, width], "INT8", rows, weights), -1]
        if bias is not None:
            bias = np.asarray(bias, np.float32)
            if bias.shape != (n,):
                raise ValueError(f"bias [{n}], got {bias.shape}")
            inputs[2] = self.tensor(f"bias_{i}", [n], "FLOAT32", bias)
        if output is None:
            output = self.tensor(f"logits_{i}", [-1, n], "FLOAT32")
        options = schema.FullyConnectedOptionsT()
        options.asymmetricQuantizeInputs = True
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(schema.BuiltinOperator.FULLY_CONNECTED)
        op.inputs, op.outputs = np.array(inputs, np.int32), np.array([output], np.int32)
        op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        op.builtinOptions = options
        return op
