"""Writes pyarrow / pandas variants of the parquet fixtures of tests/data/test_parquet.cpp.

Each tests/fixtures/parquet/<stem>.jsonl becomes <stem>_pyarrow_<variant>.parquet (and
<stem>_pandas.parquet); the C++ test reads every *.parquet there and compares it with its
<stem>.jsonl. Needs pyarrow (and pandas for the pandas variant):

    python tools/parquet/make_fixtures_pyarrow.py

The schemas are spelled out (not inferred) so that nulls, empty lists and int64/double/bool
fields get the same types as in tools/parquet/make_fixtures.mjs.
"""
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "parquet"

message = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMAS = {
    "rows": pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(message)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([
            ("split", pa.string()),
            ("index", pa.int64()),
            ("score", pa.float64()),
            ("flag", pa.bool_()),
            ("level", pa.int32()),  # REQUIRED in the JS files; the rows read back the same
            ("tags", pa.list_(pa.string())),
        ])),
    ]),
    "sft": pa.schema([("prompt", pa.string()), ("response", pa.string()), ("messages", pa.list_(message))]),
    "nested": pa.schema([
        pa.field("id", pa.string(), nullable=False),
        ("ls", pa.list_(pa.struct([("x", pa.int32()), ("y", pa.list_(pa.int64()))]))),
        ("m", pa.map_(pa.string(), pa.int32())),
        ("f", pa.float32()),
        ("b", pa.bool_()),
    ]),
}

# name -> keyword arguments of pq.write_table
VARIANTS = {
    "defaults": {},
    "zstd_rowgroups": {"compression": "zstd", "row_group_size": 10},
    "gzip_nodict": {"compression": "gzip", "use_dictionary": False},
    "uncompressed_v2": {"compression": "none", "data_page_version": "2.0"},
    "snappy_smallpages": {"compression": "snappy", "data_page_size": 64, "write_batch_size": 4},
    "legacy_lists": {"use_compliant_nested_type": False, "compression": "snappy"},
}


def rows_of(stem):
    text = (OUT / f"{stem}.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if stem == "nested":  # a map is a list of (key, value) pairs for pyarrow
        for r in rows:
            if r["m"] is not None:
                r["m"] = list(r["m"].items())
    return rows


def main():
    for stem, schema in SCHEMAS.items():
        table = pa.Table.from_pylist(rows_of(stem), schema=schema)
        for name, kwargs in VARIANTS.items():
            path = OUT / f"{stem}_pyarrow_{name}.parquet"
            pq.write_table(table, path, **kwargs)
            print(f"{path}: {path.stat().st_size} bytes")
        if stem != "nested":  # pandas has no map type to round-trip
            import pandas as pd

            path = OUT / f"{stem}_pandas.parquet"
            df = pd.DataFrame(rows_of(stem))
            pd.DataFrame.to_parquet(df, path, index=False)
            print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
