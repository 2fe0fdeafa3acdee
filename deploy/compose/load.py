"""The compose file's app: a small, steady MongoDB load through the sidecar on 127.0.0.1:27017."""

import os
import time

from pymongo import MongoClient

URI = os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017/?directConnection=true")
RATE = float(os.environ.get("RATE", "20"))

client = MongoClient(URI, serverSelectionTimeoutMS=10_000)
orders = client.demo.orders
n = 0
while True:
    try:
        orders.insert_one({"n": n})
        orders.find_one({"n": n})
        n += 1
        if n % 100 == 0:
            print(f"{n} orders written and read through the sidecar", flush=True)
    except Exception as e:  # the sidecar answered with an error: show it and go on, as an app would
        print(f"error: {e}", flush=True)
    time.sleep(1 / RATE)
