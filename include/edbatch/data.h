// Data sets for the models edbatch batches: binary sentiment trees, character lattices and
// tagged sentences. Loaders for the usual text formats, seeded synthetic generators with the
// same shape statistics, and the statistics themselves.
#pragma once
#include <cstdint>
#include <istream>
#include <map>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

namespace edbatch {

// Word and tag ids shared by several files: pass the same Vocabulary to each load or parse, and
// a word (or tag) seen before keeps its id while new ones continue the numbering, so a training
// set and its held-out set index the same embedding rows and output classes. (Lattice files hold
// their ids already.)
struct Vocabulary {
  std::unordered_map<std::string, uint32_t> words, tags;  // ids before folding
  std::vector<std::string> spellings, tag_names;          // tagged files: as TaggedData's
  // Sentence pairs: the vocabulary files of the first pair of files read (source, target);
  // pair files read later take their ids from these, not from the vocab.<ext> beside them.
  std::unordered_map<std::string, uint32_t> source_words, target_words;
};

// The words and tags in id order, as metadata of a weights file ("edbatch.words",
// "edbatch.tags": JSON lists; none for a vocabulary without words, e.g. synthetic data).
std::map<std::string, std::string> vocabulary_metadata(const Vocabulary& vocabulary);
// The vocabulary that metadata holds, spellings folded by vocab_size as the loaders fold them:
// files read with it give its words and tags their ids again. Empty without such metadata.
// Throws std::invalid_argument naming `source` for a malformed list or a name listed twice.
Vocabulary vocabulary_from_metadata(const std::map<std::string, std::string>& metadata,
                                    uint32_t vocab_size, const std::string& source);

// ---- Binary trees (Stanford Sentiment Treebank) ----

struct TreeNode {
  int32_t left = -1, right = -1;  // indices into Tree::nodes; -1 for a leaf
  uint32_t word = 0;              // leaves only
  uint8_t label = 0;              // 0..4
  bool leaf() const { return left < 0; }
};

// Post-order: children come before their parent, and the root is nodes.back().
struct Tree {
  std::vector<TreeNode> nodes;
};

// One bracketed tree per line, e.g. "(3 (2 It) (4 (2 's) (4 good)))". Word ids are given in order
// of first appearance in the input, then folded modulo vocab_size (0 = no folding).
// With `vocabulary`, words continue its numbering (and are added to it).
std::vector<Tree> parse_trees(std::istream& in, const std::string& source_name,
                              uint32_t vocab_size = 256, Vocabulary* vocabulary = nullptr);
std::vector<Tree> load_trees(const std::string& path, uint32_t vocab_size = 256,
                             Vocabulary* vocabulary = nullptr);

// ---- Lattices (character lattices with word arcs, as in lattice LSTMs) ----

struct LatticeArc {
  uint32_t from;  // source node, always below the node the arc enters
  uint32_t id;    // vocabulary id of the character or word on the arc
};

struct Lattice {
  std::vector<uint8_t> tags;        // one per node (character position), length() entries
  std::vector<uint32_t> arc_begin;  // length() + 1 entries: arcs into node k are
                                    // arcs[arc_begin[k] .. arc_begin[k+1])
  std::vector<LatticeArc> arcs;
  uint32_t length() const { return static_cast<uint32_t>(tags.size()); }
  // Character arcs join neighbouring nodes; every other arc spans a word.
  static bool is_word_arc(uint32_t k, const LatticeArc& a) { return a.from + 1 != k; }
};

// Text format: the number of lattices on the first line; then per lattice a line with its length
// L, a line of L integer tags, and L lines "n from_1 id_1 ... from_n id_n" listing the arcs into
// nodes 0..L-1. Blank lines separate lattices. Arc ids are folded modulo vocab_size (0 = none).
std::vector<Lattice> parse_lattices(std::istream& in, const std::string& source_name,
                                    uint32_t vocab_size = 256);
std::vector<Lattice> load_lattices(const std::string& path, uint32_t vocab_size = 256);

// ---- Tagged sentences ----

struct TaggedSentence {
  std::vector<uint32_t> words;
  std::vector<uint32_t> tags;  // one per word
};

struct TaggedData {
  std::vector<TaggedSentence> sentences;
  uint32_t num_tags = 0;
  std::vector<std::string> tag_names;  // indexed by tag id
  // Indexed by word id: the word as spelled in the input. An id beyond the end, or an empty
  // entry, has no spelling (e.g. data built in code); bilstm_tagger then derives its characters.
  std::vector<std::string> spellings;
};

// One sentence per line, "word|TAG word|TAG ...". Word ids by first appearance, folded modulo
// vocab_size (0 = none); tag ids by first appearance, never folded. spellings[id] is the first
// word that took the id: when several words fold onto one id, the later ones' spellings are lost.
// With `vocabulary`, words and tags continue its numbering (and are added to it); num_tags,
// tag_names and spellings are then the vocabulary's, over every file it has read.
TaggedData parse_tagged(std::istream& in, const std::string& source_name, uint32_t vocab_size = 256,
                        Vocabulary* vocabulary = nullptr);
TaggedData load_tagged(const std::string& path, uint32_t vocab_size = 256,
                       Vocabulary* vocabulary = nullptr);

// ---- Sentence pairs (translation: IWSLT'15 en-vi format) ----

// Word ids 0, 1, 2 are <unk>, <s>, </s> (the first three lines of an IWSLT vocabulary file).
constexpr uint32_t kUnk = 0, kBos = 1, kEos = 2;

struct SentencePair {
  std::vector<uint32_t> source, target;  // without <s> and </s>
};

// A source file and a target file aligned by line (tokens separated by spaces), each with its
// vocabulary file (one word per line, the id is the line number; the first three lines are
// <unk>, <s>, </s>). Unknown words are <unk>; ids at or above vocab_size fold into
// [3, vocab_size) (3 + (id - 3) mod (vocab_size - 3)), so the special ids stay apart;
// vocab_size is 0 (no folding) or at least 4. Empty lines pair as empty sentences and are
// skipped when either side is empty. Errors name file and line.
std::vector<SentencePair> load_pairs(const std::string& source_path,
                                     const std::string& source_vocab,
                                     const std::string& target_path,
                                     const std::string& target_vocab, uint32_t vocab_size);
// "SOURCE,TARGET": load_pairs with the vocabularies vocab.<extension> in each file's folder.
// With a `vocabulary` that holds a pair of vocabularies already (Vocabulary::source_words),
// the files take their ids from it (words it lacks are <unk>) and vocab.<extension> is not
// read; else the vocabularies read are stored in it.
std::vector<SentencePair> load_pair_files(const std::string& spec, uint32_t vocab_size,
                                          Vocabulary* vocabulary = nullptr);
// The fold above, for one id.
uint32_t fold_word(uint32_t id, uint32_t vocab_size);

// ---- Synthetic data: deterministic for a seed ----

// SST-like: 19 words on average (1..52), random bracketings of depth ~10 on average and up to
// ~30, labels 0..4 on every node, Zipf-distributed word ids.
std::vector<Tree> synthetic_trees(uint32_t n, uint64_t seed, uint32_t vocab_size = 256);
// 44 nodes on average (5..200), a character arc into every node k >= 1, and word arcs of 2..4
// characters making about a third of the arcs; tags 0..17.
std::vector<Lattice> synthetic_lattices(uint32_t n, uint64_t seed, uint32_t vocab_size = 256);
// 10..50 words per sentence; a word's tag mostly follows from the word, so it can be learned.
std::vector<TaggedSentence> synthetic_tagged(uint32_t n, uint64_t seed, uint32_t vocab_size = 256,
                                             uint32_t num_tags = 18);
// Spellings for word ids 0..vocab_size-1 to go with synthetic_tagged (their own random stream,
// so the sentences do not change): distinct lowercase words of 2..12 letters with English letter
// frequencies, shorter for the frequent (low) ids, as in running text.
std::vector<std::string> synthetic_spellings(uint32_t vocab_size, uint64_t seed);

// Source sentences of 3..30 words (Zipf ids from 3) and targets that follow from them (each
// source word mapped by a fixed permutation, in reverse order, every fifth one doubled), so the
// target length varies with the source and a model can learn it.
std::vector<SentencePair> synthetic_pairs(uint32_t n, uint64_t seed, uint32_t vocab_size = 256);

// ---- Writers: the text formats above ----

// Word id i is written as the token "w<i>", in tagged files as spellings[i] when it has one (tag
// id t, in tagged files without tag names, as "T<t>"). The loaders number words (and tags) by
// first appearance, so a written file loads back to the same structures with ids renumbered in
// that order (ids with equal spellings merge) and each token keeps its spelling; lattice arc ids
// are written as they are and load back unchanged. Throw std::invalid_argument for a malformed
// instance or a spelling with white space.
void write_trees(std::ostream& out, const std::vector<Tree>& trees);
void write_lattices(std::ostream& out, const std::vector<Lattice>& lattices);
void write_tagged(std::ostream& out, const std::vector<TaggedSentence>& sentences,
                  const std::vector<std::string>& tag_names = {},
                  const std::vector<std::string>& spellings = {});

// ---- Statistics ----

// Edges on the longest root-to-leaf path (0 for a one-word tree). Throws std::invalid_argument
// when the tree is not in post-order.
uint32_t tree_depth(const Tree& tree);
uint32_t tree_words(const Tree& tree);

struct TreeStats {
  uint32_t count = 0;
  double mean_words = 0;
  uint32_t min_words = 0, max_words = 0;
  double mean_depth = 0;
  uint32_t max_depth = 0;
};
TreeStats tree_stats(const std::vector<Tree>& trees);

struct LatticeStats {
  uint32_t count = 0;
  double mean_nodes = 0;
  uint32_t min_nodes = 0, max_nodes = 0;
  double mean_arcs = 0;
  double word_arc_fraction = 0;  // over all arcs of all lattices
};
LatticeStats lattice_stats(const std::vector<Lattice>& lattices);

}  // namespace edbatch
