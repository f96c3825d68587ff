// ParquetFile: the footer, the schema tree, and record assembly from repetition/definition
// levels (Dremel; parquet-format LogicalTypes.md for LIST/MAP and their legacy forms) into JSON.
// Column chunks are decoded by parquet_pages.cpp, the metadata by parquet_thrift.cpp.
#include "data/parquet.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "data/parquet_format.h"

namespace verl::data {
namespace pq = parquet;
using OJ = nlohmann::ordered_json;

namespace {

constexpr int kMaxSchemaDepth = 64;
constexpr int64_t kMaxFooterBytes = int64_t{1} << 28;

// A node of the schema tree (groups and leaves), with its levels.
struct SchemaNode {
  const pq::SchemaElement* el = nullptr;
  std::vector<SchemaNode> children;
  int def = 0, rep = 0;  // max definition / repetition level at this node
  int leaf = -1;         // column index for a leaf
  std::string path;      // dotted
};

// The logical shape the JSON takes: structs, lists (maps are lists of key/value structs),
// primitives. `def` is the definition level at which the value is present (not null); for a
// list, `elem_def` is the level at which it has at least one element and `rep` the repetition
// level of its elements.
struct Shape {
  enum Kind { Primitive, Struct, List } kind = Primitive;
  std::string name;
  int def = 0, elem_def = 0, rep = 0;
  bool is_map = false;
  int leaf = -1;
  std::vector<Shape> children;  // Struct: fields; List: one element
};

bool is_list(const pq::SchemaElement& e) {
  return e.converted_type == pq::CT_LIST || e.logical_type == pq::LT_LIST;
}
bool is_map(const pq::SchemaElement& e) {
  return e.converted_type == pq::CT_MAP || e.converted_type == pq::CT_MAP_KEY_VALUE ||
         e.logical_type == pq::LT_MAP;
}

}  // namespace

struct ParquetFile::Impl {
  std::string path;
  int64_t file_size = 0;
  pq::FileMetaData meta;
  SchemaNode root;
  std::vector<pq::LeafInfo> leaves;
  std::vector<Shape> fields;  // top-level shapes
  std::vector<std::vector<const Shape*>>
      paths;  // per leaf: the shapes from the top field down to it
  bool has_maps = false;

  void build_schema();
  void build_node(SchemaNode& node, size_t& next, int depth);
  Shape shape_of(const SchemaNode& node, bool as_element);
  void collect_paths(const Shape& s, std::vector<const Shape*>& stack);
  std::vector<uint8_t> read_bytes(int64_t offset, int64_t size, const std::string& where) const;
};

void ParquetFile::Impl::build_node(SchemaNode& node, size_t& next, int depth) {
  VERL_CHECK(depth <= kMaxSchemaDepth, "{}: the schema nests deeper than {} levels", path,
             kMaxSchemaDepth);
  const pq::SchemaElement& el = *node.el;
  VERL_CHECK(
      el.num_children >= 0 && static_cast<size_t>(el.num_children) <= meta.schema.size() - next,
      "{}: schema element '{}' claims {} children, the schema has {} elements left", path, el.name,
      el.num_children, meta.schema.size() - next);
  for (int32_t c = 0; c < el.num_children; ++c) {
    VERL_CHECK(next < meta.schema.size(),
               "{}: schema element '{}' claims {} children, the schema ends after {}", path,
               el.name, el.num_children, c);
    SchemaNode child;
    child.el = &meta.schema[next++];
    const pq::SchemaElement& ce = *child.el;
    VERL_CHECK(
        ce.repetition >= pq::REQUIRED && ce.repetition <= pq::REPEATED,
        "{}: schema element '{}' has repetition type {} (expected REQUIRED, OPTIONAL or REPEATED)",
        path, ce.name, ce.repetition);
    child.def = node.def + (ce.repetition != pq::REQUIRED ? 1 : 0);
    child.rep = node.rep + (ce.repetition == pq::REPEATED ? 1 : 0);
    child.path = node.path.empty() ? ce.name : node.path + "." + ce.name;
    if (ce.num_children > 0 || ce.type < 0) {
      VERL_CHECK(ce.type < 0, "{}: column '{}' has both a type and children", path, child.path);
      build_node(child, next, depth + 1);
    } else {
      pq::LeafInfo li;
      li.path = child.path;
      li.type = ce.type;
      li.type_length = ce.type_length;
      li.max_def = child.def;
      li.max_rep = child.rep;
      const bool string_like =
          ce.converted_type == pq::CT_UTF8 || ce.converted_type == pq::CT_ENUM ||
          ce.converted_type == pq::CT_JSON || ce.logical_type == pq::LT_STRING ||
          ce.logical_type == pq::LT_ENUM || ce.logical_type == pq::LT_JSON;
      const bool decimal = ce.converted_type == pq::CT_DECIMAL || ce.logical_type == pq::LT_DECIMAL;
      li.scale = ce.logical_type == pq::LT_DECIMAL ? ce.logical_scale : ce.scale;
      const bool unsigned_int =
          (ce.converted_type >= pq::CT_UINT_8 && ce.converted_type <= pq::CT_UINT_64) ||
          (ce.logical_type == pq::LT_INTEGER && !ce.int_signed);
      switch (ce.type) {
        case pq::BOOLEAN:
          li.kind = pq::ValueKind::Bool;
          break;
        case pq::INT32:
        case pq::INT64:
          li.kind = decimal        ? pq::ValueKind::Decimal
                    : unsigned_int ? pq::ValueKind::UInt
                                   : pq::ValueKind::Int;
          break;
        case pq::FLOAT:
          li.kind = pq::ValueKind::Float;
          break;
        case pq::DOUBLE:
          li.kind = pq::ValueKind::Double;
          break;
        case pq::BYTE_ARRAY:
          li.kind = decimal       ? pq::ValueKind::Decimal
                    : string_like ? pq::ValueKind::String
                                  : pq::ValueKind::Bytes;
          break;
        case pq::FIXED_LEN_BYTE_ARRAY:
          VERL_CHECK(ce.type_length > 0,
                     "{}: column '{}' is FIXED_LEN_BYTE_ARRAY with type_length {}", path,
                     child.path, ce.type_length);
          li.kind = decimal                             ? pq::ValueKind::Decimal
                    : ce.logical_type == pq::LT_UUID    ? pq::ValueKind::Uuid
                    : ce.logical_type == pq::LT_FLOAT16 ? pq::ValueKind::Float16
                    : string_like                       ? pq::ValueKind::String
                                                        : pq::ValueKind::Bytes;
          VERL_CHECK(li.kind != pq::ValueKind::Float16 || ce.type_length == 2,
                     "{}: FLOAT16 column '{}' needs "
                     "type_length 2",
                     path, child.path);
          break;
        case pq::INT96:
          VERL_FAIL(
              "{}: column '{}' is INT96 (legacy timestamps), which verl.cpp does not read; write "
              "timestamps "
              "as INT64 (pyarrow: coerce_timestamps='us') or drop the column",
              path, child.path);
        default:
          VERL_FAIL("{}: column '{}' has unknown physical type {}", path, child.path, ce.type);
      }
      child.leaf = static_cast<int>(leaves.size());
      leaves.push_back(li);
    }
    node.children.push_back(std::move(child));
  }
}

// LogicalTypes.md, "Nested Types" and its backward-compatibility rules for lists.
Shape ParquetFile::Impl::shape_of(const SchemaNode& node, bool as_element) {
  const pq::SchemaElement& el = *node.el;
  Shape s;
  s.name = el.name;
  if (el.repetition == pq::REPEATED && !as_element) {
    // A bare repeated field: a list that is never null, empty when nothing is defined.
    s.kind = Shape::List;
    s.def = node.def - 1;
    s.elem_def = node.def;
    s.rep = node.rep;
    s.children.push_back(shape_of(node, true));
    return s;
  }
  if (node.leaf >= 0) {
    s.kind = Shape::Primitive;
    s.def = node.def;
    s.leaf = node.leaf;
    return s;
  }
  const bool list = is_list(el), map = is_map(el);
  if ((list || map) && node.children.size() == 1 &&
      node.children[0].el->repetition == pq::REPEATED) {
    const SchemaNode& repeated = node.children[0];
    s.kind = Shape::List;
    s.def = node.def;
    s.elem_def = repeated.def;
    s.rep = repeated.rep;
    if (map) {
      VERL_CHECK(repeated.leaf < 0 && repeated.children.size() == 2,
                 "{}: MAP column '{}' needs a repeated "
                 "key/value group of two fields",
                 path, node.path);
      s.is_map = true;
      has_maps = true;
      s.children.push_back(shape_of(repeated, true));
    } else if (repeated.leaf >= 0 || repeated.children.size() != 1 ||
               repeated.el->name == "array" || repeated.el->name == el.name + "_tuple") {
      // 2-level list: the repeated field is the element itself.
      s.children.push_back(shape_of(repeated, true));
    } else {
      // 3-level list: optional group (LIST) { repeated group list { <element> } }.
      s.children.push_back(shape_of(repeated.children[0], false));
    }
    return s;
  }
  s.kind = Shape::Struct;
  s.def = node.def;
  for (const SchemaNode& c : node.children) s.children.push_back(shape_of(c, false));
  return s;
}

void ParquetFile::Impl::collect_paths(const Shape& s, std::vector<const Shape*>& stack) {
  stack.push_back(&s);
  if (s.kind == Shape::Primitive) paths[static_cast<size_t>(s.leaf)] = stack;
  for (const Shape& c : s.children) collect_paths(c, stack);
  stack.pop_back();
}

void ParquetFile::Impl::build_schema() {
  VERL_CHECK(!meta.schema.empty(), "{}: the footer has an empty schema", path);
  root.el = &meta.schema[0];
  size_t next = 1;
  build_node(root, next, 0);
  VERL_CHECK(next == meta.schema.size(), "{}: the schema tree covers {} of its {} elements", path,
             next, meta.schema.size());
  VERL_CHECK(!leaves.empty(), "{}: the schema has no columns", path);
  for (const SchemaNode& c : root.children) fields.push_back(shape_of(c, false));
  paths.resize(leaves.size());
  std::vector<const Shape*> stack;
  for (const Shape& f : fields) collect_paths(f, stack);

  int64_t total = 0;
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const pq::RowGroup& rg = meta.row_groups[g];
    VERL_CHECK(rg.num_rows >= 0, "{}: row group {} has {} rows", path, g, rg.num_rows);
    VERL_CHECK(rg.columns.size() == leaves.size(),
               "{}: row group {} has {} column chunks, the schema {} columns", path, g,
               rg.columns.size(), leaves.size());
    for (size_t c = 0; c < leaves.size(); ++c) {
      const pq::ColumnMeta& cm = rg.columns[c];
      const std::string& name = leaves[c].path;
      VERL_CHECK(!cm.encrypted, "{}: row group {}, column {}: encrypted columns are not supported",
                 path, g, name);
      VERL_CHECK(cm.file_path.empty(),
                 "{}: row group {}, column {}: data in another file ({}) is not supported", path, g,
                 name, cm.file_path);
      VERL_CHECK(cm.has_meta_data, "{}: row group {}, column {}: no column metadata", path, g,
                 name);
      VERL_CHECK(cm.type == leaves[c].type,
                 "{}: row group {}, column {}: chunk type {} differs from the schema's {}", path, g,
                 name, pq::type_name(cm.type), pq::type_name(leaves[c].type));
      std::string joined;
      for (const std::string& p : cm.path_in_schema) joined += (joined.empty() ? "" : ".") + p;
      VERL_CHECK(cm.path_in_schema.empty() || joined == name,
                 "{}: row group {}: column chunk {} is '{}', the "
                 "schema says '{}'",
                 path, g, c, joined, name);
    }
    total += rg.num_rows;
  }
  VERL_CHECK(total == meta.num_rows, "{}: the row groups hold {} rows, the footer says {}", path,
             total, meta.num_rows);
}

std::vector<uint8_t> ParquetFile::Impl::read_bytes(int64_t offset, int64_t size,
                                                   const std::string& where) const {
  VERL_CHECK(offset >= 0 && size >= 0 && offset <= file_size && size <= file_size - offset,
             "{}: bytes [{}, +{}) lie outside the file of {} bytes", where, offset, size,
             file_size);
  std::ifstream in(path, std::ios::binary);
  VERL_CHECK(in.good(), "{}: cannot open", path);
  std::vector<uint8_t> buf(static_cast<size_t>(size));
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(buf.data()), size);
  VERL_CHECK(in.gcount() == size, "{}: short read of {} bytes at offset {}", where, size, offset);
  return buf;
}

ParquetFile::ParquetFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ParquetFile::ParquetFile(ParquetFile&&) noexcept = default;
ParquetFile& ParquetFile::operator=(ParquetFile&&) noexcept = default;
ParquetFile::~ParquetFile() = default;

ParquetFile ParquetFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  VERL_CHECK(in.good(), "{}: cannot open parquet file", path);
  impl->file_size = static_cast<int64_t>(in.tellg());
  in.close();
  const int64_t size = impl->file_size;
  VERL_CHECK(size >= 12,
             "{}: {} bytes is too short for a parquet file (magic, footer length, magic)", path,
             size);
  const std::vector<uint8_t> head = impl->read_bytes(0, 4, path);
  const std::vector<uint8_t> tail = impl->read_bytes(size - 8, 8, path);
  VERL_CHECK(std::memcmp(tail.data() + 4, "PARE", 4) != 0,
             "{}: encrypted parquet footers are not supported", path);
  VERL_CHECK(
      std::memcmp(head.data(), "PAR1", 4) == 0 && std::memcmp(tail.data() + 4, "PAR1", 4) == 0,
      "{}: not a parquet file (no PAR1 magic at the start and the end)", path);
  const int64_t footer_len =
      int64_t{tail[0]} | int64_t{tail[1]} << 8 | int64_t{tail[2]} << 16 | int64_t{tail[3]} << 24;
  VERL_CHECK(footer_len > 0 && footer_len <= size - 12 && footer_len <= kMaxFooterBytes,
             "{}: footer length {} does not fit in the file of {} bytes (truncated file?)", path,
             footer_len, size);
  const std::vector<uint8_t> footer = impl->read_bytes(size - 8 - footer_len, footer_len, path);
  impl->meta = pq::decode_file_metadata(footer.data(), footer.size(), path + ": footer");
  impl->build_schema();
  return ParquetFile(std::move(impl));
}

const std::string& ParquetFile::path() const {
  return impl_->path;
}
int64_t ParquetFile::num_rows() const {
  return impl_->meta.num_rows;
}
int ParquetFile::num_row_groups() const {
  return static_cast<int>(impl_->meta.row_groups.size());
}

int64_t ParquetFile::row_group_num_rows(int i) const {
  VERL_CHECK(i >= 0 && i < num_row_groups(), "{}: row group {} out of range ({})", impl_->path, i,
             num_row_groups());
  return impl_->meta.row_groups[static_cast<size_t>(i)].num_rows;
}

std::vector<std::string> ParquetFile::column_names() const {
  std::vector<std::string> names;
  for (const Shape& f : impl_->fields) names.push_back(f.name);
  return names;
}

namespace {

// Puts one leaf's values into the rows (Dremel assembly, one column at a time). Each slot's
// definition level says how deep its path is defined; its repetition level says which list
// gets a new element (cur[r] counts the element at repetition level r, deeper counters reset).
void assemble_leaf(const std::vector<const Shape*>& path, const pq::ColumnValues& cv,
                   std::vector<OJ>& rows, bool first_leaf, int64_t rg_rows,
                   const std::string& where, int64_t row_base) {
  int max_rep = 0;
  for (const Shape* s : path) max_rep = std::max(max_rep, s->kind == Shape::List ? s->rep : 0);
  std::vector<size_t> cur(static_cast<size_t>(max_rep) + 1, 0);  // rep levels are 1-based
  size_t vi = 0;
  int64_t row = -1;
  const size_t n = cv.def.size();
  for (size_t i = 0; i < n; ++i) {
    const int r = cv.rep[i], d = cv.def[i];
    if (r == 0) {
      ++row;
      if (first_leaf) {
        rows.emplace_back(OJ::object());
      } else {
        VERL_CHECK(row < static_cast<int64_t>(rows.size()),
                   "{}: the column has more rows than earlier columns ({})", where, rows.size());
      }
      std::fill(cur.begin(), cur.end(), 0);
    } else {
      VERL_CHECK(row >= 0, "{}: the first value continues a row (repetition level {})", where, r);
      VERL_CHECK(static_cast<size_t>(r) < cur.size(), "{}: repetition level {} too deep", where, r);
      ++cur[static_cast<size_t>(r)];
      for (size_t l = static_cast<size_t>(r) + 1; l < cur.size(); ++l) cur[l] = 0;
    }
    OJ& row_obj = rows[static_cast<size_t>(row)];
    OJ* slot = &row_obj[path.front()->name];
    for (size_t k = 0; k < path.size(); ++k) {
      const Shape& s = *path[k];
      const auto bad = [&](const char* want) {
        VERL_FAIL(
            "{}, row {}: levels disagree with earlier columns (expected {} at '{}', found {})",
            where, row_base + row + 1, want, s.name, slot->type_name());
      };
      if (d < s.def) {
        // Null here (the slot stays null; a struct filled by an earlier column would be a
        // mismatch).
        if (!slot->is_null()) bad("null");
        break;
      }
      if (s.kind == Shape::Primitive) {
        VERL_CHECK(vi < cv.values.size(), "{}, row {}: more defined slots than values", where,
                   row_base + row + 1);
        if (!slot->is_null()) bad("an empty slot");
        *slot = cv.values[vi++];
        break;
      }
      if (s.kind == Shape::Struct) {
        if (slot->is_null())
          *slot = OJ::object();
        else if (!slot->is_object())
          bad("an object");
        slot = &(*slot)[path[k + 1]->name];
        continue;
      }
      // List.
      if (slot->is_null())
        *slot = OJ::array();
      else if (!slot->is_array())
        bad("a list");
      if (d < s.elem_def) break;  // empty list
      const size_t idx = cur[static_cast<size_t>(s.rep)];
      if (idx == slot->size())
        slot->push_back(nullptr);
      else if (idx > slot->size())
        bad("a list element in order");
      slot = &(*slot)[idx];
    }
  }
  VERL_CHECK(vi == cv.values.size(), "{}: {} values but {} defined slots", where, cv.values.size(),
             vi);
  VERL_CHECK(row + 1 == rg_rows, "{}: the column holds {} rows, the row group {}", where, row + 1,
             rg_rows);
}

// Maps were assembled as lists of {key, value}; make them objects (keys as text).
void convert_maps(const Shape& s, OJ& v) {
  if (v.is_null()) return;
  switch (s.kind) {
    case Shape::Primitive:
      return;
    case Shape::Struct:
      for (const Shape& c : s.children)
        if (auto it = v.find(c.name); it != v.end()) convert_maps(c, *it);
      return;
    case Shape::List: {
      for (OJ& e : v) convert_maps(s.children[0], e);
      if (!s.is_map) return;
      const Shape& kv = s.children[0];
      OJ obj = OJ::object();
      for (OJ& e : v) {
        if (!e.is_object()) continue;
        const auto key = e.find(kv.children[0].name), value = e.find(kv.children[1].name);
        const OJ k = key == e.end() ? OJ() : *key;
        obj[k.is_string() ? k.get<std::string>() : k.dump()] = value == e.end() ? OJ() : *value;
      }
      v = std::move(obj);
      return;
    }
  }
}

}  // namespace

std::vector<OJ> ParquetFile::read_row_group(int i) const {
  const Impl& im = *impl_;
  VERL_CHECK(i >= 0 && i < num_row_groups(), "{}: row group {} out of range ({})", im.path, i,
             num_row_groups());
  const pq::RowGroup& rg = im.meta.row_groups[static_cast<size_t>(i)];
  int64_t row_base = 0;
  for (int g = 0; g < i; ++g) row_base += im.meta.row_groups[static_cast<size_t>(g)].num_rows;

  std::vector<OJ> rows;
  for (size_t c = 0; c < im.leaves.size(); ++c) {
    const pq::ColumnMeta& cm = rg.columns[c];
    const std::string where =
        fmt::format("{}: row group {}, column {}", im.path, i, im.leaves[c].path);
    int64_t start = cm.data_page_offset;
    // The dictionary page, when there is one, comes first. Some writers put 0 here for "none".
    if (cm.dictionary_page_offset > 0 && cm.dictionary_page_offset < start)
      start = cm.dictionary_page_offset;
    const std::vector<uint8_t> chunk = im.read_bytes(start, cm.total_compressed_size, where);
    const pq::ColumnValues cv =
        pq::read_column_chunk(chunk.data(), chunk.size(), cm, im.leaves[c], where);
    assemble_leaf(im.paths[c], cv, rows, c == 0, rg.num_rows, where, row_base);
  }
  if (im.has_maps)
    for (OJ& row : rows)
      for (const Shape& f : im.fields) convert_maps(f, row[f.name]);
  return rows;
}

}  // namespace verl::data
