// chart.hpp — a line chart as a plain-text SVG file (no plotting dependency).
//
// Panels of lines of (x, y) points, with axes, ticks, a title and a legend. The simulator
// draws the hot tenant's cumulative admitted cost per strategy against the r·T + B envelope,
// and the same minus r·T (where the envelope is the flat line B).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gateway_sim {

struct Series {
  std::string name;
  std::string color;
  std::string dash;  // SVG stroke-dasharray, "" for a solid line
  std::vector<std::pair<double, double>> points;
};

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `n` ticks over `span`.
inline double nice_step(double span, int n) {
  if (span <= 0) return 1;
  const double raw = span / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One panel: axes, grid, lines and legend, drawn at vertical offset `y0` of a 960-wide
// SVG, 540 high. Series are drawn in order: later ones on top.
// With y_lo < y_hi the y range is fixed to [y_lo, y_hi] and lines are clipped to it.
inline void render_panel(std::string& svg, double y0, const std::string& title,
                         const std::string& x_label, const std::string& y_label,
                         const std::vector<Series>& series, double y_lo = 0, double y_hi = 0,
                         int id = 0) {
  const double w = 960, h = 540, left = 90, right = 230, top = y0 + 50, bottom = 60;
  const double pw = w - left - right, ph = h - 50 - bottom;
  double x_max = 0, y_max = 0, y_min = 0;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
      y_min = std::min(y_min, y);
    }
  }
  if (x_max <= 0) x_max = 1;
  if (y_max <= y_min) y_max = y_min + 1;
  const bool fixed = y_lo < y_hi;
  if (fixed) {
    y_min = y_lo;
    y_max = y_hi;
  }
  const double xs = nice_step(x_max, 6), ys = nice_step(y_max - y_min, 6);
  x_max = std::ceil(x_max / xs) * xs;
  if (!fixed) {
    y_max = std::ceil(y_max / ys) * ys;
    y_min = std::floor(y_min / ys) * ys;
  }
  auto px = [&](double x) { return left + x / x_max * pw; };
  auto py = [&](double y) { return top + ph - (y - y_min) / (y_max - y_min) * ph; };

  absl::StrAppendFormat(
      &svg, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"16\" font-weight=\"bold\">%s</text>\n", left,
      y0 + 28, xml_escape(title));
  for (double x = 0; x <= x_max + xs / 2; x += xs) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
        px(x), top, px(x), top + ph, px(x), top + ph + 18, x);
  }
  for (double y = y_min; y <= y_max + ys / 2; y += ys) {
    const double v = std::abs(y) < ys / 1e6 ? 0.0 : y;  // no "-0" label
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                          left, py(y), left + pw, py(y), v == 0 ? "#a0a0a0" : "#e0e0e0", left - 6,
                          py(y) + 4, v);
  }
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                        "stroke=\"#444\"/>\n",
                        left, top, pw, ph);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        left + pw / 2, y0 + h - 18, xml_escape(x_label));
  absl::StrAppendFormat(&svg,
                        "<text transform=\"translate(22 %.1f) rotate(-90)\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        top + ph / 2, xml_escape(y_label));
  absl::StrAppendFormat(&svg,
                        "<clipPath id=\"plot%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                        "height=\"%.1f\"/></clipPath>\n",
                        id, left, top, pw, ph);
  double ly = top + 10;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(x), py(y));
    const std::string dash =
        s.dash.empty() ? "" : absl::StrCat(" stroke-dasharray=\"", s.dash, "\"");
    absl::StrAppendFormat(
        &svg,
        "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s clip-path=\"url(#plot%d)\" "
        "points=\"%s\"/>\n",
        s.color, dash, id, pts);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          left + pw + 15, ly, left + pw + 45, ly, s.color, dash, left + pw + 52,
                          ly + 4, xml_escape(s.name));
    ly += 22;
  }
}

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  double y_lo = 0, y_hi = 0;  // a fixed y range when y_lo < y_hi
};

// Panels stacked vertically in one SVG document.
inline std::string render_svg(const std::vector<Panel>& panels) {
  const double w = 960, h = 540 * static_cast<double>(panels.size());
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"13\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      w, h, w, h);
  for (std::size_t i = 0; i < panels.size(); ++i) {
    render_panel(svg, 540 * static_cast<double>(i), panels[i].title, panels[i].x_label,
                 panels[i].y_label, panels[i].series, panels[i].y_lo, panels[i].y_hi,
                 static_cast<int>(i));
  }
  svg += "</svg>\n";
  return svg;
}

// Writes `text` to `path`; false (with errno set) on failure.
inline bool write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace gateway_sim
