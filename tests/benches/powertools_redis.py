"""Powertools for AWS Lambda (Python), idempotency on its Redis persistence layer, outside Lambda:
p50 of an idempotent function's first call (a new order id each time) and of its replay (the
same order again), on the Redis of REDIS_URL. Prints one line:
    powertools first_p50_us=310.2 replay_p50_us=432.1 samples=2000
"""
import os
import statistics
import sys
import time
import uuid
import warnings
from urllib.parse import urlparse

warnings.filterwarnings("ignore")

import redis
from aws_lambda_powertools.utilities.idempotency import (
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
    RedisCachePersistenceLayer,
)

url = urlparse(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
samples = int(os.environ.get("BENCH_SAMPLES", "2000"))
client = redis.Redis(host=url.hostname or "127.0.0.1", port=url.port or 6379)
store = RedisCachePersistenceLayer(client=client)
config = IdempotencyConfig(expires_after_seconds=900)
run = uuid.uuid4().hex


@idempotent_function(data_keyword_argument="order", config=config, persistence_store=store)
def charge(order):
    return {"charge_id": "ch_" + order["id"], "amount": order["amount"], "currency": "EUR"}


def p50(f, n):
    times = []
    for i in range(n):
        start = time.perf_counter_ns()
        f(i)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000.0


for i in range(200):  # warm up
    charge(order={"id": f"warm-{run}-{i}", "amount": 4200})
first = p50(lambda i: charge(order={"id": f"{run}-{i}", "amount": 4200}), samples)
replay = p50(lambda i: charge(order={"id": f"{run}-{i}", "amount": 4200}), samples)
keys = list(client.scan_iter(match="*charge*", count=1000))
for i in range(0, len(keys), 500):
    client.delete(*keys[i : i + 500])
print(f"powertools first_p50_us={first:.1f} replay_p50_us={replay:.1f} samples={samples}")
sys.stdout.flush()
