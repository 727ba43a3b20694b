"""The export group: what a finished run writes besides ``<run dir>/model``, and how closely each export must
reproduce the module it came from (gte_pro.export.release, gte_pro.export.cross_encoder)."""

from dataclasses import dataclass
from typing import Any

from gte_pro.config.rules import FLAG, integer, number
from gte_pro.config.schema.types import setting


@dataclass
class ExportSchema:
    """Exports and their checks (conf/export/default.yaml). Every export is loaded back and must reproduce the
    module's embeddings (or, ``task=rerank``, its scores), or the run fails."""

    hf: Any = setting(True, "<run dir>/hf: plain Hugging Face layout (AutoModel/AutoTokenizer + gte_pro_pooling.json)",
                      FLAG)
    onnx: Any = setting(False, "<run dir>/model.onnx: backbone + pooling + normalisation in one graph (needs pip "
                        "install -e '.[export]')", FLAG)
    onnx_opset: int = setting(17, "the ONNX opset of model.onnx", integer(9))
    model_card: Any = setting(True, "README.md model card in <run dir>/model: base model, data, loss, "
                              "hyper-parameters, metrics", FLAG)
    min_cosine: float = setting(0.9999, "each export's embeddings against the module's: the worst cosine allowed",
                                number(-1, 1))
    round_trip_max_abs_diff: float = setting(1e-6, "a state-dict save/load round trip must reproduce the embeddings "
                                             "to this (max abs diff)", number(0))
    gpu_max_abs_diff: float = setting(1e-4, "with a GPU present: CPU vs GPU embeddings (fp32, TF32 off) must agree "
                                      "to this (max abs diff)", number(0))
    score_max_abs_diff: float = setting(1e-4, "task=rerank: each export's scores of the verification pairs against "
                                        "the module's (max abs diff)", number(0))
