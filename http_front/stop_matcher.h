// Stop strings (OpenAI's `stop`) matched on generated text that arrives in pieces.
#ifndef K3SERVE_HTTP_FRONT_STOP_MATCHER_H_
#define K3SERVE_HTTP_FRONT_STOP_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace k3 {

// A stop string may be cut anywhere by token boundaries, so text that could be the start of one
// is held back until the following text settles it: the concatenated output is the generated
// text up to (not including) the first occurrence of any stop string, and no piece of a stop
// string is ever emitted. With UTF-8 input and stop strings every emitted piece is valid UTF-8:
// a held-back suffix starts where a stop string's first (lead) byte matches.
//
// Not thread-safe: one per stream.
class StopMatcher {
 public:
  // Empty stop strings are ignored (they would match before any text).
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds generated text; returns what may be emitted now. After a stop string matched, returns
  // the text before it and ignores everything after.
  std::string Push(std::string_view text);
  // The end of the generation: the text still held back (it did not become a stop string).
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  const std::vector<std::string> stops_;
  std::string pending_;  // text that may be the start of a stop string
  bool stopped_ = false;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_STOP_MATCHER_H_
