// Writes the parquet fixtures of tests/data/test_parquet.cpp with two independent writers:
// hyparquet-writer (pure JS; data pages v2) and parquet-wasm (the Rust `parquet` crate compiled
// to wasm, fed Arrow tables built by apache-arrow; data pages v1 and v2). Each
// <stem>_<writer>_<variant>.parquet holds the rows of tests/fixtures/parquet/<stem>.jsonl, which
// the test compares against.
//
//   (cd tests/fixtures/npm && npm ci) && node tools/parquet/make_fixtures.mjs
//
// rows.jsonl: verl RL rows (prompt list<struct>, reward_model struct, extra_info struct of mixed
// types with nulls at every level); sft.jsonl: SFT rows (prompt/response strings, messages).
import { execFileSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { readFileSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { gzipSync } from 'node:zlib'

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const out = join(root, 'tests', 'fixtures', 'parquet')
const { parquetWriteBuffer } = await import(join(root, 'tests/fixtures/npm/node_modules/hyparquet-writer/src/index.js'))
const require = createRequire(join(root, 'tests/fixtures/npm/package.json'))
const arrow = require('apache-arrow')
const wasm = require('parquet-wasm')

// Node 20 has no zstd in zlib: the zstd command line tool compresses instead.
const compressors = {
  GZIP: bytes => new Uint8Array(gzipSync(bytes)),
  ZSTD: bytes => new Uint8Array(execFileSync('zstd', ['-q', '-c', '-9'], { input: bytes })),
}

const str = (name, repetition_type = 'OPTIONAL') =>
  ({ name, type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type })
// 3-level LIST of `element` (SchemaElement list, element first), as pyarrow writes it.
const list = (name, element, elementChildren = 0) => [
  { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { ...element, name: 'element', ...(elementChildren ? { num_children: elementChildren } : {}) },
]
const message = list('prompt', { repetition_type: 'OPTIONAL' }, 2).concat([str('role'), str('content')])

const schemas = {
  rows: [
    { name: 'schema', num_children: 5 },
    str('data_source'),
    ...message,
    str('ability'),
    { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
    str('style'), str('ground_truth'),
    { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 6 },
    str('split'),
    { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' },
    { name: 'score', type: 'DOUBLE', repetition_type: 'OPTIONAL' },
    { name: 'flag', type: 'BOOLEAN', repetition_type: 'OPTIONAL' },
    { name: 'level', type: 'INT32', repetition_type: 'REQUIRED' },
    ...list('tags', str('element')),
  ],
  // Reader coverage beyond verl's schema: nulls at every level of list<struct<int, list<int64>>>,
  // a MAP, a FLOAT and a REQUIRED string.
  nested: [
    { name: 'schema', num_children: 5 },
    str('id', 'REQUIRED'),
    ...list('ls', { repetition_type: 'OPTIONAL' }, 2).concat([
      { name: 'x', type: 'INT32', repetition_type: 'OPTIONAL' },
      ...list('y', { type: 'INT64', repetition_type: 'OPTIONAL' }),
    ]),
    { name: 'm', repetition_type: 'OPTIONAL', converted_type: 'MAP', num_children: 1 },
    { name: 'key_value', repetition_type: 'REPEATED', num_children: 2 },
    str('key', 'REQUIRED'),
    { name: 'value', type: 'INT32', repetition_type: 'OPTIONAL' },
    { name: 'f', type: 'FLOAT', repetition_type: 'OPTIONAL' },
    { name: 'b', type: 'BOOLEAN', repetition_type: 'OPTIONAL' },
  ],
  sft: [
    { name: 'schema', num_children: 3 },
    str('prompt'),
    str('response'),
    ...list('messages', { repetition_type: 'OPTIONAL' }, 2).concat([str('role'), str('content')]),
  ],
}

// INT64 columns take BigInt values.
const big = v => (v === null || v === undefined ? v : BigInt(v))
function toBigInt(stem, rows) {
  if (stem === 'rows') {
    return rows.map(r => r.extra_info ? { ...r, extra_info: { ...r.extra_info, index: big(r.extra_info.index) } } : r)
  }
  if (stem === 'nested') {
    return rows.map(r => ({ ...r, ls: r.ls && r.ls.map(e => e && { ...e, y: e.y && e.y.map(big) }) }))
  }
  return rows
}

const variants = {
  snappy: { codec: 'SNAPPY' },
  uncompressed_rowgroups: { codec: 'UNCOMPRESSED', rowGroupSize: 7, pageSize: 256 },
  gzip: { codec: 'GZIP', compressors },
  zstd_rowgroups: { codec: 'ZSTD', compressors, rowGroupSize: 10 },
}

for (const stem of Object.keys(schemas)) {
  const rows = readFileSync(join(out, `${stem}.jsonl`), 'utf8').split('\n').filter(l => l.trim()).map(l => JSON.parse(l))
  const data = toBigInt(stem, rows)
  const schema = schemas[stem]
  const names = []
  for (let i = 1, skip = 0; i < schema.length; i++) {
    if (skip === 0) names.push(schema[i].name)
    else skip--
    skip += schema[i].num_children ?? 0
  }
  for (const [variant, opts] of Object.entries(variants)) {
    if (stem !== 'rows' && variant !== 'snappy' && variant !== 'uncompressed_rowgroups') continue
    const columnData = names.map(name => ({ name, data: data.map(r => r[name] ?? null) }))
    const buf = parquetWriteBuffer({ columnData, schema, statistics: false, ...opts })
    const file = join(out, `${stem}_hyparquet_${variant}.parquet`)
    writeFileSync(file, new Uint8Array(buf))
    console.log(`${file}: ${buf.byteLength} bytes`)
  }
}

// ---- parquet-wasm (arrow-rs) ----

const A = arrow
const f = (name, type, nullable = true) => new A.Field(name, type, nullable)
const msgType = new A.Struct([f('role', new A.Utf8()), f('content', new A.Utf8())])
const arrowSchemas = {
  rows: [
    f('data_source', new A.Utf8()),
    f('prompt', new A.List(f('element', msgType))),
    f('ability', new A.Utf8()),
    f('reward_model', new A.Struct([f('style', new A.Utf8()), f('ground_truth', new A.Utf8())])),
    f('extra_info', new A.Struct([
      f('split', new A.Utf8()), f('index', new A.Int64()), f('score', new A.Float64()), f('flag', new A.Bool()),
      f('level', new A.Int32(), false), f('tags', new A.List(f('element', new A.Utf8()))),
    ])),
  ],
  sft: [f('prompt', new A.Utf8()), f('response', new A.Utf8()), f('messages', new A.List(f('element', msgType)))],
  nested: [
    f('id', new A.Utf8(), false),
    f('ls', new A.List(f('element', new A.Struct([f('x', new A.Int32()), f('y', new A.List(f('element', new A.Int64())))])))),
    f('m', new A.Map_(f('key_value', new A.Struct([f('key', new A.Utf8(), false), f('value', new A.Int32())]), false))),
    f('f', new A.Float32()),
    f('b', new A.Bool()),
  ],
}

const W = wasm
const arrowVariants = {
  v1_snappy: b => b.setCompression(W.Compression.SNAPPY),
  v1_zstd_rowgroups: b => b.setCompression(W.Compression.ZSTD).setMaxRowGroupSize(10),
  v1_gzip_nodict: b => b.setCompression(W.Compression.GZIP).setDictionaryEnabled(false),
  v1_uncompressed_smallpages: b => b.setCompression(W.Compression.UNCOMPRESSED).setDataPageSizeLimit(64).setWriteBatchSize(4),
  v2_snappy: b => b.setCompression(W.Compression.SNAPPY).setWriterVersion(W.WriterVersion.V2),
}

for (const stem of Object.keys(arrowSchemas)) {
  const rows = readFileSync(join(out, `${stem}.jsonl`), 'utf8').split('\n').filter(l => l.trim()).map(l => JSON.parse(l))
  let data = toBigInt(stem, rows)
  if (stem === 'nested') data = data.map(r => ({ ...r, m: r.m && new Map(Object.entries(r.m)) }))
  const columns = {}
  for (const field of arrowSchemas[stem]) columns[field.name] = A.vectorFromArray(data.map(r => r[field.name] ?? null), field.type)
  const ipc = A.tableToIPC(new A.Table(columns), 'stream')
  for (const [variant, configure] of Object.entries(arrowVariants)) {
    if (stem !== 'rows' && variant !== 'v1_snappy' && variant !== 'v1_uncompressed_smallpages') continue
    const props = configure(new W.WriterPropertiesBuilder().setStatisticsEnabled(W.EnabledStatistics.None)).build()
    const buf = W.writeParquet(W.Table.fromIPCStream(ipc), props)
    const file = join(out, `${stem}_arrowrs_${variant}.parquet`)
    writeFileSync(file, buf)
    console.log(`${file}: ${buf.byteLength} bytes`)
  }
}

// A verl row file whose `prompt` column has the wrong type (INT64 instead of a list of messages):
// the dataset must refuse it naming the file, the row and the field.
{
  const schema = [
    { name: 'schema', num_children: 2 },
    str('data_source'),
    { name: 'prompt', type: 'INT64', repetition_type: 'OPTIONAL' },
  ]
  const columnData = [
    { name: 'data_source', data: ['arith', 'arith'] },
    { name: 'prompt', data: [7n, 8n] },
  ]
  const buf = parquetWriteBuffer({ columnData, schema, statistics: false })
  const file = join(out, 'bad', 'prompt_int64_hyparquet.parquet')
  writeFileSync(file, new Uint8Array(buf))
  console.log(`${file}: ${buf.byteLength} bytes`)
}
