"""Config values renamed since a run folder may have recorded them: an old value still means the same thing
(resume's comparison of ``run_config.json``, ``gte_pro.config.schema.schema_for``, ``gte_pro.modes.build_data``).
Imports nothing: the data and config packages read it at import time."""

# data._target_ before the data module was made of parts (it named a data module class per source): an old config
# file or run record names the same source
RENAMED_TARGETS = {"gte_pro.data.demo.DemoDataModule": "gte_pro.data.demo.DemoRows",
                   "gte_pro.data.jsonl.JsonlDataModule": "gte_pro.data.jsonl.JsonlRows",
                   "gte_pro.data.hf.HFDataModule": "gte_pro.data.hf.HfRows",
                   "gte_pro.data.beir.BeirDataModule": "gte_pro.data.beir_rows.BeirRows",
                   "gte_pro.data.mix.MixDataModule": "gte_pro.data.mix.Mixing"}
