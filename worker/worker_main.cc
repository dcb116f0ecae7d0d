// ps_worker: trains a Fashion-MNIST classifier against an asyncps cluster.
//
//   ps_worker --servers=h:p,h:p --worker_id=0 --num_workers=4
//   ps_worker --local            # same model and data, no servers
//
// Flags are parsed here into TrainerOptions / PsClientOptions and nowhere
// else.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ps_client.h"
#include "common/cli.h"
#include "common/connection_check.h"
#include "common/identity.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/net.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "common/version.h"
#include "data/idx_reader.h"
#include "kernels/backend.h"
#include "membership/etcd_flags.h"
#include "membership/shard_addressing.h"
#include "models/mlp.h"
#include "worker/ctr_trainer.h"
#include "worker/local_store.h"
#include "worker/parameter_store.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, servers, "",
          "Shard addresses host:port,... in shard order (required unless "
          "--local or --etcd_endpoints). An address with {i} stands for "
          "--num_shards addresses, {i} = 0 .. num_shards-1 "
          "(asyncps-shard-0-{i}.asyncps:7000).");
ABSL_FLAG(int, num_shards, 0,
          "The shard count: needed by an address with {i} in --servers; "
          "when > 0, --servers (and the etcd shard map) must have exactly "
          "this many shards. 0 = as many as --servers lists.");
ABSL_FLAG(bool, local, false,
          "Train in-process without servers (the single-worker baseline).");
ABSL_FLAG(std::string, worker_id, "0",
          "This worker's index in [0, --num_workers), or auto: the "
          "JOB_COMPLETION_INDEX a Kubernetes Indexed Job sets in each pod.");
ABSL_FLAG(int, num_workers, 1, "Number of workers sharing the data.");
ABSL_FLAG(std::string, hidden, "256,128",
          "Hidden layer sizes, comma-separated; empty = softmax regression.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size.");
ABSL_FLAG(int64_t, epochs, 10, "Passes over this worker's share.");
ABSL_FLAG(int64_t, steps, 0, "If > 0, stop after this many steps.");
ABSL_FLAG(std::string, optimizer, "momentum", "sgd, momentum or adam.");
ABSL_FLAG(double, lr, 0.01, "Learning rate (applied on the servers).");
// 0.8 rather than the usual 0.9: asynchronous updates from several workers
// add momentum of their own. Measured with deploy/local.sh (2 shards + 4
// workers, 20 epochs): 0.885-0.886 test accuracy at 0.8, 0.866-0.868 at 0.9;
// in-process (--local) 0.8875 vs 0.8881.
ABSL_FLAG(double, momentum, 0.8,
          "Momentum for --optimizer=momentum (0.8: asynchronous workers add "
          "implicit momentum of their own).");
ABSL_FLAG(int64_t, seed, 1, "Seed for initial weights and shuffling.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory with the Fashion-MNIST *-ubyte.gz files.");
ABSL_FLAG(std::string, device, "auto",
          "Compute backend: auto (CUDA when a GPU is present), cpu or cuda.");
ABSL_FLAG(std::string, evaluate, "auto",
          "Evaluate on the test set: auto (worker 0 only), true or false.");
ABSL_FLAG(int64_t, eval_every_steps, 0,
          "Evaluate every this many steps; 0 = once per epoch (mlp), at the "
          "end only (ctr).");
ABSL_FLAG(int64_t, log_every_steps, 100, "Progress line interval in steps.");
ABSL_FLAG(int64_t, delay_spike_ms, 0,
          "With --delay_spike_prob: sleep this long on a random share of the "
          "steps (transient delays, for experiments).");
ABSL_FLAG(double, delay_spike_prob, 0,
          "Probability in [0, 1] that a step sleeps --delay_spike_ms.");
ABSL_FLAG(int64_t, straggler_delay_ms, 0,
          "Sleep this long every step (simulates a slow worker).");
ABSL_FLAG(std::string, eval_csv, "",
          "Write one CSV row per evaluation to this file.");
ABSL_FLAG(int64_t, rpc_timeout_ms, 120000,
          "Deadline of one attempt of a unary RPC (heartbeat, create, "
          "status).");
ABSL_FLAG(int64_t, call_deadline_s, 300,
          "Every call to the shards gives up after this long, retrying "
          "transient failures (a shard restarting, a connection lost) with "
          "backoff meanwhile. Keep above the shards' --pull_wait_timeout_ms.");
ABSL_FLAG(int64_t, wait_for_shards_s, 120,
          "At start, wait this long for every shard to answer (workers may "
          "start before their shards), naming the missing ones every few "
          "seconds.");
ABSL_FLAG(int, connections_per_shard, 2,
          "TCP connections to each shard; pulls and pushes are spread over "
          "them.");
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "Type of values on the wire: fp32, bf16 (gradients and pulled "
          "parameters), bf16_push (gradients only) or bf16_pull (parameters "
          "only). Shards keep float32.");
ABSL_FLAG(bool, already_trained_ok, false,
          "A share an earlier process of this run trained is exit 0 (said in "
          "the log) instead of 3: for launchers that restart a whole job, "
          "such as a requeued Slurm job, where some workers had finished.");
ABSL_FLAG(bool, pipeline, true,
          "Overlap communication with computation: pull the next step's "
          "parameters while this step computes, push while the next runs. "
          "Always off with --local (nothing to overlap).");
ABSL_FLAG(int, max_pushes_in_flight, 2,
          "Pushes in flight at most; more wait for the oldest.");
ABSL_FLAG(int, push_every, 1,
          "Compute this many steps locally (plain SGD on a local copy), then "
          "push the summed gradient once.");
ABSL_FLAG(int64_t, wait_for_tensors_s, 600,
          "Workers other than 0: wait this long for the tensors worker 0 "
          "creates, saying what is missing every few seconds.");
ABSL_FLAG(std::string, run_id, "",
          "The run this worker belongs to; must be the shards' --run_id "
          "(else exit 2).");
ABSL_FLAG(int64_t, final_wait_s, 600,
          "Evaluating worker: wait at most this long for the others to "
          "finish before the final evaluation.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error.");
ABSL_FLAG(std::string, model, "mlp",
          "mlp: the Fashion-MNIST classifier; ctr: a DLRM-like click model "
          "(embedding tables on the shards' sparse tables, an MLP on top) "
          "on a synthetic click log with a known Bayes-optimal AUC. With "
          "ctr, --hidden, --batch_size, --optimizer, --lr and --epochs "
          "default to 64,32, 256, adam, 0.001 and 1.");
ABSL_FLAG(int64_t, ctr_train_examples, 8000000,
          "ctr: examples in the synthetic click log's train split (shared "
          "by the workers).");
ABSL_FLAG(int64_t, ctr_test_examples, 200000,
          "ctr: examples in the test split (evaluated by worker 0).");
ABSL_FLAG(std::string, ctr_vocab,
          "2000000,1000000,500000,200000,50000,10000,1000,100",
          "ctr: distinct ids of each categorical field (one embedding table "
          "per field), comma-separated.");
ABSL_FLAG(double, ctr_zipf, 1.2,
          "ctr: Zipf exponent of the fields' id popularity.");
ABSL_FLAG(int, ctr_dense_features, 4, "ctr: dense features per example.");
ABSL_FLAG(int, embedding_dim, 16, "ctr: embedding dimension of every table.");
ABSL_FLAG(std::string, table_optimizer, "adagrad",
          "ctr: optimizer of the embedding rows: sgd, momentum, adagrad or "
          "adam (lazy: touched rows only).");
ABSL_FLAG(double, table_lr, 0.1, "ctr: learning rate of the embedding rows.");
ABSL_FLAG(int, table_admit_count, 0,
          "ctr: an id gets an embedding row only after this many pushes "
          "(count-min sketch on the shards); 0 = on first touch.");
ABSL_FLAG(double, table_admit_probability, 0,
          "ctr: an id without a row gets one with this probability per push, "
          "in (0, 1]; 0 = off. Not with --table_admit_count.");
ABSL_FLAG(
    std::string, table_eviction, "ttl",
    "ctr: what the shards do with embedding rows at "
    "--max_parameter_bytes: ttl (refuse new rows; evict only by "
    "--row_ttl_steps), lru or lfu (evict the coldest rows to make room).");
ABSL_FLAG(double, ctr_drift_share, 0,
          "ctr: share of the ids drawn from a drifting id space (fresh ids, "
          "Zipf-ranked within a moving window); 0 = off.");
ABSL_FLAG(int64_t, ctr_drift_window, 100000,
          "ctr: ids in the drifting window (newest most popular).");
ABSL_FLAG(double, ctr_drift_ids_per_example, 1.0,
          "ctr: how many ids the drifting window moves per train example.");
ABSL_FLAG(double, embedding_init, 0.01,
          "ctr: embedding rows start uniform in [-x, x).");

namespace asyncps {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_worker: %s\n", message.c_str());
  return 2;
}

// Which worker of how many this process is (--worker_id, --num_workers).
absl::Status RoleFromFlags(TrainerOptions* out) {
  TrainerOptions& o = *out;
  o.num_workers =
      absl::GetFlag(FLAGS_local) ? 1 : absl::GetFlag(FLAGS_num_workers);
  absl::StatusOr<int> worker_id =
      ResolveIndexFlag("worker_id", absl::GetFlag(FLAGS_worker_id),
                       AutoIndexSource::kJobCompletionIndex, std::nullopt,
                       ProcessEnvironment("JOB_COMPLETION_INDEX"));
  if (!worker_id.ok()) return worker_id.status();
  o.worker_id = absl::GetFlag(FLAGS_local) ? 0 : *worker_id;
  if (o.num_workers < 1) {
    return absl::InvalidArgumentError("--num_workers must be >= 1");
  }
  if (o.worker_id < 0 || o.worker_id >= o.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_id must be in [0, --num_workers=", o.num_workers,
                     "), got ", o.worker_id));
  }
  return absl::OkStatus();
}

// The model and its optimization: layers, batches, epochs, optimizer.
absl::Status ModelFromFlags(TrainerOptions* out) {
  TrainerOptions& o = *out;
  absl::StatusOr<std::vector<int>> layers = ParseLayerSizes(
      absl::GetFlag(FLAGS_hidden), 28 * 28, kFashionMnistClasses);
  if (!layers.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden: ", layers.status().message()));
  }
  o.layer_sizes = *layers;
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (o.batch_size < 1 || o.batch_size > 65536) {
    return absl::InvalidArgumentError("--batch_size must be in [1, 65536]");
  }
  o.epochs = absl::GetFlag(FLAGS_epochs);
  if (o.epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");
  o.max_steps = absl::GetFlag(FLAGS_steps);
  if (o.max_steps < 0)
    return absl::InvalidArgumentError("--steps must be >= 0");
  if (o.max_steps > 0) o.epochs = std::numeric_limits<int64_t>::max();
  const std::string opt = absl::GetFlag(FLAGS_optimizer);
  const double lr = absl::GetFlag(FLAGS_lr);
  if (!(lr > 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError("--lr must be > 0");
  }
  o.optimizer.set_learning_rate(static_cast<float>(lr));
  if (opt == "sgd") {
    o.optimizer.set_type(OPT_SGD);
  } else if (opt == "momentum") {
    o.optimizer.set_type(OPT_MOMENTUM);
    const double m = absl::GetFlag(FLAGS_momentum);
    if (!(m >= 0 && m < 1)) {
      return absl::InvalidArgumentError("--momentum must be in [0, 1)");
    }
    o.optimizer.set_momentum(static_cast<float>(m));
  } else if (opt == "adam") {
    o.optimizer.set_type(OPT_ADAM);
    o.optimizer.set_beta1(0.9f);
    o.optimizer.set_beta2(0.999f);
    o.optimizer.set_epsilon(1e-8f);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer must be sgd, momentum or adam, got '", opt, "'"));
  }
  return absl::OkStatus();
}

// Creation, evaluation and progress.
absl::Status EvaluationFromFlags(TrainerOptions* out) {
  TrainerOptions& o = *out;
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.create = o.worker_id == 0;
  const std::string eval = absl::GetFlag(FLAGS_evaluate);
  if (eval == "auto") {
    o.evaluate = o.worker_id == 0;
  } else if (eval == "true" || eval == "false") {
    o.evaluate = eval == "true";
  } else {
    return absl::InvalidArgumentError("--evaluate must be auto, true or false");
  }
  o.eval_every_steps = absl::GetFlag(FLAGS_eval_every_steps);
  o.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  if (o.eval_every_steps < 0 || o.log_every_steps < 1) {
    return absl::InvalidArgumentError(
        "--eval_every_steps must be >= 0 and --log_every_steps >= 1");
  }
  return absl::OkStatus();
}

// The loop's delays, waits and pipelining.
absl::Status LoopFromFlags(TrainerOptions* out) {
  TrainerOptions& o = *out;
  const int64_t delay = absl::GetFlag(FLAGS_straggler_delay_ms);
  if (delay < 0) {
    return absl::InvalidArgumentError("--straggler_delay_ms must be >= 0");
  }
  o.straggler_delay = absl::Milliseconds(delay);
  const int64_t spike = absl::GetFlag(FLAGS_delay_spike_ms);
  const double spike_prob = absl::GetFlag(FLAGS_delay_spike_prob);
  if (spike < 0) {
    return absl::InvalidArgumentError("--delay_spike_ms must be >= 0");
  }
  if (!(spike_prob >= 0 && spike_prob <= 1)) {
    return absl::InvalidArgumentError("--delay_spike_prob must be in [0, 1]");
  }
  o.delay_spike = absl::Milliseconds(spike);
  o.delay_spike_prob = spike_prob;
  o.eval_csv = absl::GetFlag(FLAGS_eval_csv);
  const int64_t final_wait = absl::GetFlag(FLAGS_final_wait_s);
  if (final_wait < 0) {
    return absl::InvalidArgumentError("--final_wait_s must be >= 0");
  }
  o.final_wait = absl::Seconds(final_wait);
  const int64_t wait_for_tensors = absl::GetFlag(FLAGS_wait_for_tensors_s);
  if (wait_for_tensors < 0) {
    return absl::InvalidArgumentError("--wait_for_tensors_s must be >= 0");
  }
  o.wait_for_tensors = absl::Seconds(wait_for_tensors);
  o.pipeline = absl::GetFlag(FLAGS_pipeline) && !absl::GetFlag(FLAGS_local);
  o.max_pushes_in_flight = absl::GetFlag(FLAGS_max_pushes_in_flight);
  if (o.max_pushes_in_flight < 1 || o.max_pushes_in_flight > 64) {
    return absl::InvalidArgumentError(
        "--max_pushes_in_flight must be in [1, 64]");
  }
  o.push_every = absl::GetFlag(FLAGS_push_every);
  if (o.push_every < 1 || o.push_every > 100000) {
    return absl::InvalidArgumentError("--push_every must be in [1, 100000]");
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainerOptions> TrainerOptionsFromFlags() {
  TrainerOptions o;
  absl::Status s = RoleFromFlags(&o);
  if (s.ok()) s = ModelFromFlags(&o);
  if (s.ok()) s = EvaluationFromFlags(&o);
  if (s.ok()) s = LoopFromFlags(&o);
  if (!s.ok()) return s;
  return o;
}

// An optimizer by name, with the usual hyper-parameters; `flag` and
// `lr_flag` name the flags in errors.
absl::StatusOr<OptimizerSpec> OptimizerByName(const std::string& name,
                                              double lr, const char* flag,
                                              const char* lr_flag) {
  OptimizerSpec o;
  if (!(lr > 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat(lr_flag, " must be > 0"));
  }
  o.set_learning_rate(static_cast<float>(lr));
  if (name == "sgd") {
    o.set_type(OPT_SGD);
  } else if (name == "momentum") {
    o.set_type(OPT_MOMENTUM);
    o.set_momentum(static_cast<float>(absl::GetFlag(FLAGS_momentum)));
  } else if (name == "adam") {
    o.set_type(OPT_ADAM);
    o.set_beta1(0.9f);
    o.set_beta2(0.999f);
    o.set_epsilon(1e-8f);
  } else if (name == "adagrad") {
    o.set_type(OPT_ADAGRAD);
    o.set_epsilon(1e-8f);
    o.set_initial_accumulator(0.1f);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " must be sgd, momentum, adagrad or adam, got '", name, "'"));
  }
  return o;
}

// The tables' admission and eviction and the drifting id space, from the
// flags.
absl::Status CtrPolicyFromFlags(CtrTrainerOptions* o) {
  TableSpec& t = o->table_policy;
  const int count = absl::GetFlag(FLAGS_table_admit_count);
  const double p = absl::GetFlag(FLAGS_table_admit_probability);
  if (count != 0 && p != 0) {
    return absl::InvalidArgumentError(
        "--table_admit_count and --table_admit_probability exclude each "
        "other");
  }
  if (count < 0 || count > 255 || !(p >= 0 && p <= 1)) {
    return absl::InvalidArgumentError(
        "--table_admit_count must be in [0, 255] and "
        "--table_admit_probability in [0, 1]");
  }
  if (count > 0) {
    t.set_admission(ADMIT_COUNT);
    t.set_admit_count(count);
  } else if (p > 0) {
    t.set_admission(ADMIT_PROBABILITY);
    t.set_admit_probability(static_cast<float>(p));
  }
  const std::string eviction = absl::GetFlag(FLAGS_table_eviction);
  if (eviction == "lru") {
    t.set_eviction(EVICT_LRU);
  } else if (eviction == "lfu") {
    t.set_eviction(EVICT_LFU);
  } else if (eviction != "ttl") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--table_eviction must be ttl, lru or lfu, got '", eviction, "'"));
  }
  o->data.drift_share = absl::GetFlag(FLAGS_ctr_drift_share);
  o->data.drift_window = absl::GetFlag(FLAGS_ctr_drift_window);
  o->data.drift_ids_per_example =
      absl::GetFlag(FLAGS_ctr_drift_ids_per_example);
  o->data.drift_test_at = o->train_examples;
  return absl::OkStatus();
}

// The CTR model's options from the flags; defaults that differ from the
// MLP's apply where the flag was not set.
absl::StatusOr<CtrTrainerOptions> CtrOptionsFromFlags(
    const TrainerOptions& common, const ParsedCommandLine& cl) {
  CtrTrainerOptions o;
  static_cast<LoopOptions&>(o) = common;  // what every loop shares
  // Between evaluations: none unless asked (the MLP's once per epoch is
  // the whole run here).
  if (o.eval_every_steps == 0) o.eval_every_steps = -1;
  o.epochs = cl.IsSet("epochs") ? common.epochs : 1;
  if (o.max_steps > 0) o.epochs = common.epochs;
  o.batch_size = cl.IsSet("batch_size") ? common.batch_size : 256;
  absl::StatusOr<std::vector<int>> hidden = ParseLayerSizes(
      cl.IsSet("hidden") ? absl::GetFlag(FLAGS_hidden) : "64,32", 1, 1);
  if (!hidden.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden: ", hidden.status().message()));
  }
  o.hidden.assign(hidden->begin() + 1, hidden->end() - 1);
  absl::StatusOr<OptimizerSpec> dense = OptimizerByName(
      cl.IsSet("optimizer") ? absl::GetFlag(FLAGS_optimizer) : "adam",
      cl.IsSet("lr") ? absl::GetFlag(FLAGS_lr) : 0.001, "--optimizer", "--lr");
  if (!dense.ok()) return dense.status();
  o.dense_optimizer = *dense;
  absl::StatusOr<OptimizerSpec> table = OptimizerByName(
      absl::GetFlag(FLAGS_table_optimizer), absl::GetFlag(FLAGS_table_lr),
      "--table_optimizer", "--table_lr");
  if (!table.ok()) return table.status();
  o.table_optimizer = *table;
  o.train_examples = absl::GetFlag(FLAGS_ctr_train_examples);
  o.test_examples = absl::GetFlag(FLAGS_ctr_test_examples);
  if (o.train_examples < 1 || o.test_examples < 0) {
    return absl::InvalidArgumentError(
        "--ctr_train_examples must be >= 1 and --ctr_test_examples >= 0");
  }
  o.embedding_dim = absl::GetFlag(FLAGS_embedding_dim);
  if (o.embedding_dim < 1 || o.embedding_dim > 4096) {
    return absl::InvalidArgumentError("--embedding_dim must be in [1, 4096]");
  }
  const double init = absl::GetFlag(FLAGS_embedding_init);
  if (!(init >= 0) || !std::isfinite(init)) {
    return absl::InvalidArgumentError("--embedding_init must be >= 0");
  }
  o.embedding_init = static_cast<float>(init);
  o.data.seed = common.seed;
  o.data.vocab.clear();
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_ctr_vocab), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ctr_vocab: \"", part, "\" is not a positive integer"));
    }
    o.data.vocab.push_back(v);
  }
  o.data.zipf_exponent = absl::GetFlag(FLAGS_ctr_zipf);
  o.data.dense_features = absl::GetFlag(FLAGS_ctr_dense_features);
  absl::Status s = CtrPolicyFromFlags(&o);
  if (!s.ok()) return s;
  s = ValidateCtrData(o.data);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ctr_vocab/--ctr_zipf/--ctr_dense_features/--ctr_drift_*: ",
        s.message()));
  }
  return o;
}

// SIGINT / SIGTERM: the first stops training after the current step (or
// ends any wait at once); the worker drains its pushes, leaves the shards
// and exits 128 + the signal (143 for SIGTERM): stopped early, its share not
// trained. A second signal exits at once. A handler rather than sigwait:
// libraries start threads of their own before main (OpenBLAS does), so the
// signals cannot be blocked in every thread.
std::atomic<bool> g_stop{false};
std::atomic<int> g_signals{0};
std::atomic<int> g_first_signal{0};
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  if (g_signals.fetch_add(1) > 0) _exit(128 + sig);
  g_first_signal.store(sig);
  g_stop.store(true);
  const char c = static_cast<char>(sig);
  (void)!write(g_signal_pipe[1], &c, 1);
}

// Installs OnSignal and logs the first signal from a thread of its own.
void HandleSignals(std::shared_ptr<spdlog::logger> logger) {
  if (pipe(g_signal_pipe) != 0) return;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::thread([logger] {
    char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) == 1) {
      logger->info(
          "received signal {}: stopping after the current step, then "
          "draining pushes and leaving (send it again to exit at once)",
          static_cast<int>(sig));
    }
  }).detach();
}

// Exit status of a worker stopped early by a signal: 128 + the signal.
int StoppedExitCode() { return 128 + g_first_signal.load(); }

// The exit statuses (also in --help and README).
constexpr int kExitFailed = 1;
constexpr int kExitConfig = 2;
constexpr int kExitAlreadyTrained = 3;

// The exit status after training ended: `stopped` by a signal, or the
// share `already_trained` by an earlier process.
int OutcomeExitCode(bool stopped, bool already_trained, int64_t total_steps,
                    int worker_id, spdlog::logger& logger) {
  if (stopped) {
    logger.warn(
        "stopped early by signal {}: the share is not fully trained "
        "(exit {}); a restarted worker {} continues it",
        g_first_signal.load(), StoppedExitCode(), worker_id);
    return StoppedExitCode();
  }
  if (already_trained && absl::GetFlag(FLAGS_already_trained_ok)) {
    logger.warn(
        "worker {} of this run already trained its share ({} steps) in an "
        "earlier process: nothing to do (exit 0: --already_trained_ok)",
        worker_id, total_steps);
    return 0;
  }
  if (already_trained) {
    logger.error(
        "worker {} of this run already trained its share ({} steps) in an "
        "earlier process: nothing to do (exit {}). To train again, start a "
        "new run: another --run_id for shards and workers, or shards without "
        "this run's checkpoints",
        worker_id, total_steps, kExitAlreadyTrained);
    return kExitAlreadyTrained;
  }
  return 0;
}

// The exit status of a failed run: stopped (a wait ended by a signal) or
// failure.
int FailureExitCode(const absl::Status& status, spdlog::logger& logger) {
  if (g_stop.load() && absl::IsCancelled(status)) {
    logger.warn("stopped by signal {} before training finished (exit {})",
                g_first_signal.load(), StoppedExitCode());
    return StoppedExitCode();
  }
  logger.error("training failed: {}", status.ToString());
  return kExitFailed;
}

// --wire_dtype as (push, pull) types.
absl::Status ParseWireDtype(const std::string& v, WireDtype* push,
                            WireDtype* pull) {
  *push = *pull = WIRE_F32;
  if (v == "fp32") return absl::OkStatus();
  if (v == "bf16" || v == "bf16_push") *push = WIRE_BF16;
  if (v == "bf16" || v == "bf16_pull") *pull = WIRE_BF16;
  if (v == "bf16" || v == "bf16_push" || v == "bf16_pull") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--wire_dtype must be fp32, bf16, bf16_push or bf16_pull, got '", v,
      "'"));
}

// After UNAVAILABLE ("Socket closed" for most TLS mistakes), names the
// cause for every shard that shows one.
void ExplainUnavailable(const absl::Status& status,
                        const SecurityOptions& security,
                        spdlog::logger& logger) {
  // With etcd, --servers may name old primaries: the map's moved on.
  if (!absl::IsUnavailable(status) || absl::GetFlag(FLAGS_local) ||
      !EtcdEndpointsFlag().empty()) {
    return;
  }
  absl::StatusOr<std::vector<std::string>> servers = ParseServerList(
      absl::GetFlag(FLAGS_servers), absl::GetFlag(FLAGS_num_shards));
  if (!servers.ok()) return;
  for (const std::string& address : *servers) {
    const std::string cause = DiagnoseConnection(address, security);
    if (!cause.empty()) logger.error("{}: {}", address, cause);
  }
}

// The cluster client's options from the flags (with etcd, the shards of
// the run's map, followed); errors name the flag.
absl::StatusOr<PsClientOptions> ClientOptionsFromFlags(
    int worker_id, std::shared_ptr<spdlog::logger> logger) {
  PsClientOptions c;
  c.worker_id = worker_id;
  c.run_id = absl::GetFlag(FLAGS_run_id);
  if (absl::Status r = CheckRunId(c.run_id); !r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--run_id: ", r.message()));
  }
  ShardAddressingOptions a{absl::GetFlag(FLAGS_servers),
                           absl::GetFlag(FLAGS_num_shards), "", c.run_id};
  a.router.wait_for_map = absl::Seconds(absl::GetFlag(FLAGS_wait_for_shards_s));
  a.router.logger = logger;
  std::vector<std::string> etcd_warnings;
  if (absl::Status s = AddEtcdFlags(&a, &etcd_warnings); !s.ok()) return s;
  for (const std::string& w : etcd_warnings) logger->warn("{}", w);
  absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
  if (!shards.ok()) return shards.status();
  c.servers = shards->servers;
  c.router = shards->router;
  c.stop = &g_stop;
  const int64_t timeout = absl::GetFlag(FLAGS_rpc_timeout_ms);
  if (timeout < 1) {
    return absl::InvalidArgumentError("--rpc_timeout_ms must be >= 1");
  }
  c.retry.attempt_timeout = absl::Milliseconds(timeout);
  const int64_t deadline = absl::GetFlag(FLAGS_call_deadline_s);
  if (deadline < 1) {
    return absl::InvalidArgumentError("--call_deadline_s must be >= 1");
  }
  c.retry.call_deadline = absl::Seconds(deadline);
  c.connections_per_shard = absl::GetFlag(FLAGS_connections_per_shard);
  if (c.connections_per_shard < 1 || c.connections_per_shard > 16) {
    return absl::InvalidArgumentError(
        "--connections_per_shard must be in [1, 16]");
  }
  absl::Status dtype = ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype),
                                      &c.push_dtype, &c.pull_dtype);
  if (!dtype.ok()) return dtype;
  return c;
}

// The parameter store of --local or --servers: for the cluster, a client
// connected and every shard answering. nullopt when it is open, else the
// exit code.
std::optional<int> OpenStore(int worker_id, const SecurityOptions& security,
                             const std::shared_ptr<spdlog::logger>& logger,
                             std::unique_ptr<ParameterStore>* store) {
  if (absl::GetFlag(FLAGS_local)) {
    if (!absl::GetFlag(FLAGS_servers).empty() || !EtcdEndpointsFlag().empty()) {
      return Fail("--local excludes --servers and --etcd_endpoints");
    }
    absl::StatusOr<std::unique_ptr<ParameterStore>> local = MakeLocalStore();
    if (!local.ok()) return Fail(local.status().ToString());
    *store = *std::move(local);
    return std::nullopt;
  }
  const int64_t wait_for_shards = absl::GetFlag(FLAGS_wait_for_shards_s);
  if (wait_for_shards < 0) return Fail("--wait_for_shards_s must be >= 0");
  absl::StatusOr<PsClientOptions> c = ClientOptionsFromFlags(worker_id, logger);
  if (!c.ok()) return Fail(std::string(c.status().message()));
  c->logger = logger;
  c->security = security;
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(*std::move(c));
  if (!client.ok()) return Fail(client.status().ToString());
  absl::Status up = (*client)->WaitForShards(absl::Seconds(wait_for_shards));
  if (!up.ok()) {
    if (absl::IsFailedPrecondition(up)) {  // shards of another run
      logger->error("{}", up.ToString());
      return kExitConfig;
    }
    if (absl::IsDeadlineExceeded(up)) {
      logger->error("{}", up.ToString());
      return kExitFailed;
    }
    return FailureExitCode(up, *logger);
  }
  *store = MakeRemoteStore(*std::move(client));
  return std::nullopt;
}

constexpr char kUsage[] =
    "ps_worker: trains a Fashion-MNIST MLP (or, with --model=ctr, a click\n"
    "model with sparse embedding tables) against an asyncps cluster.\n\n"
    "  ps_worker --servers=h:p,h:p --worker_id=0 --num_workers=4\n"
    "  ps_worker --etcd_endpoints=h:p --run_id=R --worker_id=0 ...\n"
    "  ps_worker --local            # same model and data, no servers\n\n"
    "Exit status: 0 when this worker's share is trained; 1 when training\n"
    "failed; 2 for bad flags, a start failure or shards of another\n"
    "--run_id; 3 when an earlier process of this worker id already\n"
    "trained the share in this run (nothing to do: start a new run to\n"
    "train again); 128 + the signal (143 for SIGTERM, 130 for SIGINT) when\n"
    "a signal stopped it early, after it drained its pushes and left.";

int Main(int argc, char** argv) {
  ProgramInfo program;
  program.name = "ps_worker";
  program.version = kVersion;
  program.flags_only = true;
  program.usage = kUsage;
  const ParseResult parsed = ParseProgramCommandLine(argc, argv, program);
  if (!parsed.command_line.has_value()) return parsed.exit_code;
  absl::StatusOr<TrainerOptions> options = TrainerOptionsFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model != "mlp" && model != "ctr") {
    return Fail(absl::StrCat("--model must be mlp or ctr, got '", model, "'"));
  }
  std::optional<CtrTrainerOptions> ctr;
  if (model == "ctr") {
    absl::StatusOr<CtrTrainerOptions> c =
        CtrOptionsFromFlags(*options, *parsed.command_line);
    if (!c.ok()) return Fail(std::string(c.status().message()));
    ctr = *std::move(c);
  }
  std::vector<std::string> warnings;
  absl::StatusOr<SecurityOptions> security =
      SecurityOptionsFromFlags(/*server=*/false, &warnings);
  if (!security.ok()) return Fail(std::string(security.status().message()));
  absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
      MakeLogger(absl::StrCat("worker", options->worker_id),
                 absl::GetFlag(FLAGS_log_level));
  if (!logger.ok()) return Fail(std::string(logger.status().message()));
  options->logger = *logger;
  for (const std::string& w : warnings) (*logger)->warn("{}", w);
  for (const std::string& w : parsed.command_line->warnings) {
    (*logger)->warn("{}", w);
  }
  // gRPC's own lines (e.g. its TLS handshake errors) only at debug: the
  // worker reports failures itself.
  RouteGrpcLogs(*logger, spdlog::level::debug);
  TuneProcess();

  HandleSignals(*logger);
  options->stop = &g_stop;

  std::unique_ptr<ParameterStore> store;
  if (std::optional<int> failed =
          OpenStore(options->worker_id, *security, *logger, &store)) {
    return *failed;
  }

  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(absl::GetFlag(FLAGS_device));
  if (!backend.ok()) {
    return Fail(absl::StrCat("--device: ", backend.status().message()));
  }
  if (ctr) {
    ctr->logger = *logger;
    ctr->stop = &g_stop;
    absl::StatusOr<CtrResult> result =
        TrainCtr(*ctr, store.get(), backend->get());
    if (!result.ok()) {
      const int code = FailureExitCode(result.status(), **logger);
      if (code == kExitFailed) {
        ExplainUnavailable(result.status(), *security, **logger);
      }
      return code;
    }
    return OutcomeExitCode(result->stopped, result->already_trained,
                           result->total_steps, options->worker_id, **logger);
  }
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  absl::StatusOr<Dataset> train = LoadFashionMnist(dir, Split::kTrain);
  if (!train.ok()) return Fail(train.status().ToString());
  absl::StatusOr<Dataset> test = LoadFashionMnist(dir, Split::kTest);
  if (!test.ok()) return Fail(test.status().ToString());

  absl::StatusOr<TrainResult> result =
      Train(*options, *train, *test, store.get(), backend->get());
  if (!result.ok()) {
    const int code = FailureExitCode(result.status(), **logger);
    if (code == kExitFailed) {
      ExplainUnavailable(result.status(), *security, **logger);
    }
    return code;
  }
  if (result->stopped) {
    (*logger)->info("stopped on request after step {} of {}; left the shards",
                    result->first_step + result->steps, result->total_steps);
  }
  return OutcomeExitCode(result->stopped, result->already_trained,
                         result->total_steps, options->worker_id, **logger);
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
