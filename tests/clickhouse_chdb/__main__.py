"""`SLUICE_CHDB_PASSWORD=PW python -m tests.clickhouse_chdb --port P --data DIR`: serve the stand-in
(tests/clickhouse_chdb/)."""

from tests.clickhouse_chdb._http import main

if __name__ == "__main__":
    main()
