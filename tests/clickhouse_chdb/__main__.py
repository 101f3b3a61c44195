"""`python -m tests.clickhouse_chdb --port P --data DIR --password PW`: serve the stand-in (tests/clickhouse_chdb/)."""

from tests.clickhouse_chdb._http import main

if __name__ == "__main__":
    main()
