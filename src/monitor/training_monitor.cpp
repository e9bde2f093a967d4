// The series of a training run under their names, written to each enabled monitor of this rank.
#include "monitor/training_monitor.h"

#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

std::string job_folder(const MonitorConfig& monitor) {
  const std::string base = monitor.output_path.empty() ? "." : monitor.output_path;
  return base + "/" + monitor.job_name;
}

// A job_name that leaves its folder would write where the user did not ask.
void check_job_name(const MonitorConfig& monitor, const std::string& key) {
  const std::string& name = monitor.job_name;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw ConfigError(key + ".job_name", "got \"" + name +
                                             "\", expected a folder name without '/' (the job's "
                                             "folder under output_path)");
  }
}

}  // namespace

TrainingMonitor::TrainingMonitor(const Config& config, int rank) : rank_(rank) {
  for (int kind = 0; kind < kCollectiveCount; ++kind) {
    comm_tags_[kind] = std::string("Comm/") + to_string(static_cast<Collective>(kind)) + "/bytes";
  }
  for (int location = 0; location < kMemoryLocationCount; ++location) {
    const std::string where = "Memory/rank" + std::to_string(rank) + "/" +
                              to_string(static_cast<MemoryLocation>(location)) + "/";
    for (int category = 0; category < kMemoryCategoryCount; ++category) {
      const std::string name = where + to_string(static_cast<MemoryCategory>(category));
      memory_tags_[location][category] = {name + "/current_bytes", name + "/peak_bytes"};
    }
    total_peak_tags_[location] = where + "total/peak_bytes";
  }
  if (config.csv_monitor.enabled) {
    check_job_name(config.csv_monitor, "csv_monitor");
    const std::string folder = job_folder(config.csv_monitor);
    create_monitor_folder(folder, "csv_monitor.output_path");
    writers_.push_back(std::make_unique<CsvWriter>(folder));
  }
  if (config.tensorboard.enabled) {
    check_job_name(config.tensorboard, "tensorboard");
    // TensorBoard reads the files of one folder one after another as one run, so every rank but
    // the first writes a run of its own.
    std::string folder = job_folder(config.tensorboard);
    if (rank > 0) folder += "/rank" + std::to_string(rank);
    create_monitor_folder(folder, "tensorboard.output_path");
    writers_.push_back(std::make_unique<EventFileWriter>(folder));
  }
}

TrainingMonitor::~TrainingMonitor() { flush(); }

void TrainingMonitor::write_step(const MonitoredStep& step) {
  if (rank_ == 0) {
    add("Train/Samples/lr", step.samples, step.lr);
    add("Train/Samples/loss_scale", step.samples, step.loss_scale);
    add("Train/Step/grad_norm", step.step, step.grad_norm);
    add("Train/Step/skipped", step.step, step.skipped ? 1.0 : 0.0);
    add("Train/Step/skipped_steps", step.step, static_cast<double>(step.skipped_steps));
    for (const auto& [tag, ms] : step.times_ms) add(tag, step.step, ms);
    for (int kind = 0; kind < kCollectiveCount; ++kind) {
      add(comm_tags_[kind], step.step, static_cast<double>(step.traffic.bytes[kind]));
    }
  }
  for (int location = 0; location < kMemoryLocationCount; ++location) {
    if (step.memory.total_peak[location] == 0) continue;
    for (int category = 0; category < kMemoryCategoryCount; ++category) {
      const MemoryUsage& usage = step.memory.usage[location][category];
      add(memory_tags_[location][category][0], step.step, static_cast<double>(usage.current));
      add(memory_tags_[location][category][1], step.step, static_cast<double>(usage.peak));
    }
    add(total_peak_tags_[location], step.step,
        static_cast<double>(step.memory.total_peak[location]));
  }
  flush_when_due();
}

void TrainingMonitor::write_loss(std::int64_t samples, double loss) {
  if (rank_ != 0) return;
  add("Train/Samples/train_loss", samples, loss);
  flush_when_due();
}

void TrainingMonitor::flush_when_due() {
  if (std::chrono::steady_clock::now() - last_flush_ >= kFlushInterval) flush();
}

void TrainingMonitor::add(std::string_view tag, std::int64_t x, double value) {
  for (auto it = writers_.begin(); it != writers_.end();) {
    try {
      (*it)->add(tag, x, value);
      ++it;
    } catch (const Error& error) {
      // Training goes on without this monitor: its files end at the last complete step.
      ZEROSHARD_LOG(kWarning, error.what() << "; this monitor stops writing, training goes on");
      it = writers_.erase(it);
    }
  }
}

void TrainingMonitor::flush() {
  last_flush_ = std::chrono::steady_clock::now();
  for (auto it = writers_.begin(); it != writers_.end();) {
    try {
      (*it)->flush();
      ++it;
    } catch (const Error& error) {
      ZEROSHARD_LOG(kWarning, error.what() << "; this monitor stops writing, training goes on");
      it = writers_.erase(it);
    }
  }
}

}  // namespace zeroshard::detail
