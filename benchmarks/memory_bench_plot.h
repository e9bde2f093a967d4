// The memory benchmark's plots: model-state bytes per rank against world size, one line per
// stage, the estimator's figure dashed beside the measured one, drawn by gnuplot as PNG and SVG.
#pragma once

#include <string>
#include <vector>

#include "memory_record.h"

namespace zeroshard::bench {

/// Writes `dir`/memory_<precision>.{dat,gp,png,svg} for each precision with measured rows and
/// returns the image paths. Without gnuplot on the PATH it writes nothing, says so on stderr
/// and returns none.
std::vector<std::string> draw_plots(const std::vector<Record>& records, const std::string& dir,
                                    const std::string& title);

}  // namespace zeroshard::bench
