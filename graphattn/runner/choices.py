"""Names the command line lists in its help without importing torch (``graphattn --help`` must be
fast). Tests check that they equal the registries (:data:`graphattn.producers.PRODUCERS`,
:data:`graphattn.nn.registry.MODELS`, :data:`graphattn.runner.tasks.TASKS`,
:data:`graphattn.nn.blocks.CONVS`)."""

from __future__ import annotations

#: the producers the package registers (``graphattn run --producer NAME``)
PRODUCER_NAMES = ("input", "full", "window", "global", "knn", "random", "expander", "virtual", "union",
                  "samsa", "sbm", "sliceformer", "sac", "converter")
#: the models the package registers (``graphattn run --model NAME``)
MODEL_NAMES = ("hybrid", "samsa", "converter", "gcn", "gat", "grand", "gcnplus", "gcnplus_attention")
#: the benchmark tasks (``graphattn run --task NAME``)
TASK_NAMES = ("cora", "citeseer", "pubmed", "peptides-func", "peptides-struct", "mutag", "proteins",
              "enzymes", "listops", "fashion-mnist", "geometric-shapes", "ucr")
#: local message-passing layers (``graphattn run --conv NAME``)
CONV_NAMES = ("gcn", "gcne", "gin", "gine", "gat", "sage", "resgated")
