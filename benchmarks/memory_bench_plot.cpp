// gnuplot scripts and data for the memory benchmark's plots.
#include "memory_bench_plot.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace zeroshard::bench {

namespace {

bool gnuplot_found() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

/// Model-state bytes per (stage, world size): the largest over ranks, measured and estimated.
struct Point {
  double measured_mb = 0.0;
  double theory_mb = 0.0;
};

/// The plots show the ZeRO curves of the device: rows without any offload.
bool resident(const Record& r) {
  return r.ok() && r.value("offload_optimizer") == "none" && r.value("offload_param") == "none";
}

}  // namespace

std::vector<std::string> draw_plots(const std::vector<Record>& records, const std::string& dir,
                                    const std::string& title) {
  if (!gnuplot_found()) {
    std::cerr << "notice: gnuplot not found; skipping the plots (apt-get install gnuplot-nox)\n";
    return {};
  }
  std::set<std::string> precisions;
  for (const Record& r : records) {
    if (resident(r)) precisions.insert(r.value("precision"));
  }
  std::vector<std::string> images;
  for (const std::string& precision : precisions) {
    std::map<int, std::map<int, Point>> series;  // stage -> world size -> point
    for (const Record& r : records) {
      if (!resident(r) || r.value("precision") != precision) {
        continue;
      }
      Point& p = series[std::stoi(r.value("stage"))][r.world_size];
      p.measured_mb = std::max(p.measured_mb, r.measured_model_states() / 1e6);
      p.theory_mb = std::max(p.theory_mb, r.theory_model_states() / 1e6);
    }
    const std::string base = dir + "/memory_" + precision;
    // One gnuplot data block per stage: world size, measured MB, theory MB.
    std::ofstream data(base + ".dat");
    data << "# model-state bytes per rank (MB = 1e6 bytes), " << precision << "\n";
    std::vector<int> stages;
    for (const auto& [stage, points] : series) {
      stages.push_back(stage);
      data << "# stage " << stage << "\n# world_size measured_mb theory_mb\n";
      for (const auto& [n, p] : points) {
        data << n << " " << p.measured_mb << " " << p.theory_mb << "\n";
      }
      data << "\n\n";
    }
    data.close();

    std::ostringstream plot;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const int color = static_cast<int>(i) + 1;
      plot << (i ? ", \\\n     " : "plot ") << "'" << base << ".dat' index " << i
           << " using 1:2 with points pt 7 ps 1.4 lc " << color << " title 'stage " << stages[i]
           << " measured', \\\n     '" << base << ".dat' index " << i
           << " using 1:3 with lines dt 2 lw 2 lc " << color << " title 'stage " << stages[i]
           << " theory'";
    }
    std::ofstream script(base + ".gp");
    script << "# Draws " << base << ".png and .svg from " << base << ".dat\n"
           << "set title \"" << title << " - " << precision << "\" noenhanced\n"
           << "set xlabel 'world size (ranks)'\n"
           << "set ylabel 'model-state bytes per rank (MB)'\n"
           << "set xtics 1\nset grid\nset key outside right top\nset yrange [0:*]\n"
           << "set terminal pngcairo size 960,560\n"
           << "set output '" << base << ".png'\n"
           << plot.str() << "\n"
           << "set terminal svg size 960,560 dynamic\n"
           << "set output '" << base << ".svg'\n"
           << "replot\nset output\n";
    script.close();
    if (std::system(("gnuplot '" + base + ".gp'").c_str()) != 0) {
      std::cerr << "warning: gnuplot failed on " << base << ".gp\n";
      continue;
    }
    images.push_back(base + ".png");
    images.push_back(base + ".svg");
  }
  return images;
}

}  // namespace zeroshard::bench
