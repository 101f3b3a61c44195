"""`sluice doctor`: what the pipelines of a MetaService left in each store, what it costs, whose it is, and whether
removing it is safe; `--fix` removes what belongs to stopped (or dead) jobs.

    from sluice.doctor import Doctor, Stores
    doctor = Doctor("postgresql://.../meta", Stores(postgres="postgresql://user@db/app", kafka="broker:9092"))
    secured = Stores(postgres_options="pg.json", kafka_options="kafka.properties")  # files of format options
    for finding in doctor.examine():
        print(finding.line(time.time()))

One concern per module: _owners (whose a leftover is and whether its job still runs), _postgres (replication
slots, staged rows of transactional writes), _kafka (open transactions, sluice's transactional ids), _s2
(micro-batches never committed), _tablestore (writer claims, barriers in progress), _reach (PostgreSQL and Kafka
reached with the jobs' own options from a file: TLS, client certificates, SASL), _run (a round: examine, fix),
_watch (rounds on the metrics server: sluice_doctor_* gauges and the page's section).
"""

from sluice.doctor._model import (
    KAFKA_TXN,
    PG_SLOT,
    PG_STAGED,
    S2_OPEN,
    TABLE_BARRIER,
    TABLE_CLAIM,
    Action,
    Finding,
    Owner,
    Verdict,
)
from sluice.doctor._run import Doctor, Stores
from sluice.doctor._watch import DoctorWatch

__all__ = ["KAFKA_TXN", "PG_SLOT", "PG_STAGED", "S2_OPEN", "TABLE_BARRIER", "TABLE_CLAIM", "Action", "Doctor",
           "DoctorWatch", "Finding", "Owner", "Stores", "Verdict"]
