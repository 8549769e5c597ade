"""The data contract between pipeline → loader → trainer → audit, in one place (leaf package:
imports only the standard library, numpy and pydantic, nothing else from this project).

Writers (pipelines.manifest_assembly/job), the loader (dataloader.source), the trainer (trainer.loop,
trainer.logs) and the audit (audit.*) all use these names; extend the contract here
(add, never rename) so that each extension is made once.

Errors (`errors`): Refused (exit 2: the input or config is wrong, nothing written) and Stopped
  (exit 1: failed while running), the two bases of every project error class; exit_code(e) -> 2 | 1
  | None (Refused first), report(e) prints the one `error:` line and returns the exit code,
  run_main(body, stopped_code=1) runs a command's body and maps the two kinds to their exit codes
  (STOPPED_BY_VERDICT_COMMAND, 3, for a Stopped in a command whose exit 1 is a FAIL).
Config models (`config_model`): Model (the base of every typed config: the trainer's sections,
  the tokenize job's mixture files; strict, frozen, unknown keys refused; each family names its
  error class and prefix), the value types (Float, Int, Strs, ...), check / one_of / below /
  refuse, build(cls, raw), nearest(key, valid); pydantic's errors become one line naming the
  dotted key, the value and the rule.
Outputs (`outputs`): check_out_dir(out, own=KIND) / check_out_file(path) before the work
  (OutputRefused, a Refused), write_atomic(path, data) after it (temporary name with a plain
  open()'s mode, then rename; WriteFailed, a Stopped). One folder, one command: OutputKind and
  the kinds TOKENIZE_OUTPUT, TASK_BUILD, TRAINING_RUN, AUDIT_REPORT, COMPARE_REPORT,
  LESSONS_REPORT (each told by its marker files); check_output_kind(folder, own) refuses a folder
  holding another command's output.
Records (`records`):
  TOKEN_DTYPE (<u4), RECORD_FORMAT ("uint32-le[seq_len]"), GROUP_SIZE (1), WRITER_OPTIONS
  ("group_size:1"), record_bytes(seq_len), writer_options_problem(options) -> str | None,
  decode_record(bytes, seq_len) -> [seq_len] uint32, parse_records(raw, seq_len, vocab_size),
  RecordProblems, PackingProblems, DocumentSplitter(eos_id, pad_id) (.feed(records [n, seq_len])
  -> documents, .finish()), unpack(examples, eos_id, pad_id) -> list of documents.
Manifest (`manifest`):
  FORMAT_VERSION (1), MANIFEST_NAME ("manifest.json"), TRAIN, HELDOUT, SPLITS, COUNT_KEYS,
  FINGERPRINT_EXCLUDED_KEYS (("fingerprint", "build")), JSONL_REASONS and TOKEN_FILE_REASONS (every
  reject reason the pipeline writes, per source format), SOURCE_NAME_RE, RESERVED_NAMES and
  valid_source_name(name) (source names become folder names), ManifestError, TokenizerInfo
  (name, vocab_size, eos_id, pad_id, ranks_sha256), ShardRef, fingerprint(raw),
  with_fingerprint(raw), validate(raw, where, check_fingerprint=True, root=""), dumps(manifest) -> bytes,
  EXTERNAL_SHARD_ROOTS and shard_path_problem(path, root, external_roots) (shard paths resolve inside
  the manifest's folder or a declared external root; every reader refuses anything else),
  Manifest (frozen; Manifest.load(path) validates and RECOMPUTES the fingerprint, refusing a
  mismatch; Manifest.from_json(raw, path); .dump(); typed: seq_len, tokenizer, vocab_size,
  eos_id, pad_id, tokenizer_name, fingerprint, source_names, build, root, path, source(name),
  shards(split, source=None), mixture_sources(); and a read-only Mapping over the raw JSON).
Data logs (`datalog`):
  DATA_LOG_DIR ("data_log"), DATA_LOG_GLOB, data_log_name(h, H), parse_data_log_name(name)
  -> (h, H) | None, data_log_row(step, index, example), iter_jsonl(path) -> (line, obj) with
  JsonLinesError naming file:line, iter_data_log(path) (the same, each row shape-checked by
  data_log_row_problem), chain_data_sha256(previous, step, global_example).
Run record (`run`):
  RUN_RECORD_NAME ("run.json"), RUN_SCHEMA_VERSION (1), RunRecordError, Order(name, version),
  INDEX_SHUFFLE (the Grain index_shuffle order), OLMO_CORE (OLMo-core's NumpyFSLDataLoader order),
  ORDERS ({config name: Order}), order_named(name), HostRange(first_step, host_count), RunRecord
  (global_batch_size, seed, data, manifest_fingerprints, loader_fingerprint, order, seq_len,
  tokenizer, hosts, weights, split, model; .load(path or run_dir), .from_json, .to_json, .dump,
  .write(run_dir), .restarted(step, host_count), .host_count_at(step)), run_record_path(run_dir);
  SUMMARY_NAME ("summary.json"), RunSummary (step, data_sha256, path, raw; .load(path or run_dir):
  FileNotFoundError when absent, RunSummaryError naming file[:line] when damaged), RunSummaryError,
  summary_path(run_dir).
Run directory (`rundir`): RunDir(path) names every file of a trainer run directory (.metrics,
  .summary, .config, .run_record, .data_log, .checkpoints, .lock; the names as class attributes:
  RunDir.METRICS, ...); RunDir.resolved(path) is the one place a command's run directory is
  resolved (~, absolute, symlinks); RunDir.of_step(step_dir) is a checkpoint step's run.
Command lines (`cli`, imported as contract.cli): Parser (argparse's, with --a_b/--a-b, the nearest
  flag on a typo, defaults in --help, one `error:` line), integer/number/share/run_dir argparse types.
Writers' lock (`lock`, imported as contract.lock): LOCK_NAME (".olmax.lock"), FolderLock(folder,
  purpose[, ObjectLockStore]) (.acquire() -> LockHeld naming the holder; .release()), probe(folder),
  LockHeld: one tokenize job per --output, one trainer run per run_dir.
Downstream task instances (`downstream`, imported as contract.downstream): FORMAT, FORMAT_VERSION (1),
  MANIFEST_NAME, ARRAYS, RAGGED_FIELDS, INT_FIELDS, load(dir, labels=None) -> DownstreamTasks
  (manifest, tasks {label: TaskInstances (metric_type, fast_mc, arrays; .tokens(field, i),
  .lengths(field), .choices(i))}), DownstreamTasksError, write_task, write_manifest, check_arrays,
  task_meta, pack_ragged, pad_choices, OLMO3_FAST_TASKS, PRESETS, task_labels(spec).
Provenance (`provenance`, imported as contract.provenance): run_facts(module, started, argv) ->
  {olmax_version, commit, command, started_utc, duration_s}, what the reports show as run facts.
"""

from .datalog import (
    DATA_LOG_DIR,
    DATA_LOG_GLOB,
    JsonLinesError,
    chain_data_sha256,
    data_log_name,
    data_log_row,
    data_log_row_problem,
    iter_data_log,
    iter_jsonl,
    parse_data_log_name,
)
from .errors import STOPPED_BY_VERDICT_COMMAND, Refused, Stopped, exit_code, report, run_main
from .manifest import (
    COUNT_KEYS,
    DEFAULT_TOKEN_FILE_DTYPE,
    EXTERNAL_SHARD_ROOTS,
    FINGERPRINT_EXCLUDED_KEYS,
    FORMAT_VERSION,
    HELDOUT,
    JSONL,
    JSONL_REASONS,
    MANIFEST_NAME,
    REMAINDER_KEY,
    RESERVED_NAMES,
    SOURCE_FORMATS,
    SOURCE_NAME_RE,
    SOURCE_SPLITS,
    SPLITS,
    TOKEN_FILE_DTYPES,
    TOKEN_FILE_REASONS,
    TOKENS,
    TRAIN,
    Manifest,
    ManifestError,
    ShardRef,
    TokenizerInfo,
    dumps,
    fingerprint,
    shard_path_problem,
    source_format,
    valid_source_name,
    validate,
    with_fingerprint,
)
from .outputs import (
    AUDIT_REPORT,
    COMPARE_REPORT,
    LESSONS_REPORT,
    TASK_BUILD,
    TOKENIZE_OUTPUT,
    TRAINING_RUN,
    OutputKind,
    OutputRefused,
    WriteFailed,
    check_out_dir,
    check_out_file,
    check_output_kind,
    write_atomic,
)
from .records import (
    GROUP_SIZE,
    RECORD_FORMAT,
    TOKEN_DTYPE,
    WRITER_OPTIONS,
    DocumentSplitter,
    PackingProblems,
    RecordProblems,
    decode_record,
    parse_records,
    record_bytes,
    unpack,
    writer_options_problem,
)
from .run import (
    INDEX_SHUFFLE,
    OLMO_CORE,
    ORDERS,
    RUN_RECORD_NAME,
    RUN_SCHEMA_VERSION,
    SUMMARY_NAME,
    HostRange,
    Order,
    RunRecord,
    RunRecordError,
    RunSummary,
    RunSummaryError,
    order_named,
    run_record_path,
    summary_path,
)
from .rundir import RunDir

__all__ = [
    "Refused",
    "Stopped",
    "exit_code",
    "report",
    "run_main",
    "RunDir",
    "STOPPED_BY_VERDICT_COMMAND",
    "OutputRefused",
    "WriteFailed",
    "check_out_dir",
    "check_output_kind",
    "OutputKind",
    "AUDIT_REPORT",
    "COMPARE_REPORT",
    "TASK_BUILD",
    "LESSONS_REPORT",
    "TOKENIZE_OUTPUT",
    "TRAINING_RUN",
    "check_out_file",
    "write_atomic",
    "DATA_LOG_DIR",
    "DATA_LOG_GLOB",
    "JsonLinesError",
    "chain_data_sha256",
    "data_log_name",
    "data_log_row",
    "iter_jsonl",
    "iter_data_log",
    "data_log_row_problem",
    "parse_data_log_name",
    "COUNT_KEYS",
    "FINGERPRINT_EXCLUDED_KEYS",
    "FORMAT_VERSION",
    "HELDOUT",
    "MANIFEST_NAME",
    "SPLITS",
    "TRAIN",
    "DEFAULT_TOKEN_FILE_DTYPE",
    "JSONL",
    "REMAINDER_KEY",
    "SOURCE_FORMATS",
    "SOURCE_SPLITS",
    "TOKEN_FILE_DTYPES",
    "JSONL_REASONS",
    "TOKEN_FILE_REASONS",
    "TOKENS",
    "source_format",
    "RESERVED_NAMES",
    "SOURCE_NAME_RE",
    "valid_source_name",
    "EXTERNAL_SHARD_ROOTS",
    "shard_path_problem",
    "Manifest",
    "ManifestError",
    "ShardRef",
    "TokenizerInfo",
    "dumps",
    "fingerprint",
    "validate",
    "with_fingerprint",
    "GROUP_SIZE",
    "RECORD_FORMAT",
    "TOKEN_DTYPE",
    "WRITER_OPTIONS",
    "DocumentSplitter",
    "PackingProblems",
    "RecordProblems",
    "decode_record",
    "parse_records",
    "record_bytes",
    "unpack",
    "writer_options_problem",
    "INDEX_SHUFFLE",
    "OLMO_CORE",
    "ORDERS",
    "order_named",
    "RUN_RECORD_NAME",
    "RUN_SCHEMA_VERSION",
    "HostRange",
    "Order",
    "RunRecord",
    "RunRecordError",
    "run_record_path",
    "SUMMARY_NAME",
    "RunSummary",
    "RunSummaryError",
    "summary_path",
]
