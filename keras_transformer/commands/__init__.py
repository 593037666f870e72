"""What the `keras-transformer` subcommands do, one module per job (argument parsing lives in
`cli.py`, which calls the `*_command` functions re-exported here):

| module | holds |
|---|---|
| `train.py` | `train` and `prepare`: a config to a workdir, one run per workdir at a time |
| `distill.py` | `distill`: a teacher's translations of the corpus, then the student's training |
| `export.py` | `export`: a workdir's model rebuilt (`load_workdir_model`) and exported |
| `shortlist.py` | `shortlist`: a prepared workdir's vocabulary shortlist (lexical table) |
| `translate.py` | `translate`: TEXT arguments, stdin, or a file streamed and resumable |
| `evaluate.py`, `info.py` | `evaluate` and `score` on aligned files; `info`, the model card |
| `signatures.py` | a SavedModel's signatures as Python functions, called as TF Serving calls them |
| `lines.py` | the input lines read and the one writer of output lines |
| `flags.py` | the checks of what the flags mean: ranges, flags that exclude each other |
| `startup.py` | TensorFlow imported without its start-up log |

`translate`, `evaluate` and `score` run an exported SavedModel through its signatures
(`serving_default`, `translate_nbest`, `translate_prefix`, `translate_sample`, `score`), exactly as
TF Serving would. User errors are raised as `UsageError` (or another
`keras_transformer.errors.KerasTransformerError`), which `cli.py` prints as one line (exit code 2).
"""

# The names `cli.py`, the tests and the benchmarks import from here (explicit re-exports).
from keras_transformer.commands.distill import distill_command as distill_command
from keras_transformer.commands.evaluate import evaluate_command as evaluate_command
from keras_transformer.commands.evaluate import score_command as score_command
from keras_transformer.commands.export import export_command as export_command
from keras_transformer.commands.export import load_workdir_model as load_workdir_model
from keras_transformer.commands.info import info_command as info_command
from keras_transformer.commands.lines import read_lines as read_lines
from keras_transformer.commands.shortlist import shortlist_command as shortlist_command
from keras_transformer.commands.signatures import load_serving_function as load_serving_function
from keras_transformer.commands.train import prepare_command as prepare_command
from keras_transformer.commands.train import train_command as train_command
from keras_transformer.commands.translate import translate_command as translate_command
