// Hello, ldlm: the built-in demo model fills a gap, then continues a prompt.
#include <ldlm/text_model.hpp>

#include <cstdio>

int main() {
  const ldlm::TextModel lm = ldlm::TextModel::demo();
  for (const std::string& text : lm.infill("The children played in the <|mask|> after school."))
    std::printf("%s\n", text.c_str());
  for (const std::string& text : lm.continue_text("The old man", {.length = 16, .seed = 1}))
    std::printf("%s\n", text.c_str());
}
