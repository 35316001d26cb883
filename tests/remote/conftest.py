"""One real Ray cluster on this machine for the module that needs it.

A head with 0 CPUs (the trainer's node: no actor lands there) and nodes of 1 CPU with
small object stores, all on 127.0.0.1: Ray would otherwise advertise this machine's
outward address (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on loopback).
"""

from __future__ import annotations

import os

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # set before ray is imported
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report leaves the machine
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

#: Object store of each node [bytes] (Ray's minimum is 75 MiB).
STORE = 80 * 2**20
#: Nodes of 1 CPU each.
NODES = 2


@pytest.fixture(scope="module")
def cluster():
    """``(Cluster, its address)``: joined by this process, torn down after the module."""
    ray = pytest.importorskip("ray")  # the `test` extra installs it: CI never skips
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from tests.remote import datasets

    cloudpickle.register_pickle_by_value(datasets)  # the actors cannot import tests/
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": STORE,
            "include_dashboard": False,
            # no log monitor (it reads every worker's log files for the whole module, to
            # print their lines here): the tests look at unstall's own log, never at those
            "include_log_monitor": False,
            # a lost node is noticed in ~5 s, not Ray's default ~15 s (and a node merely slowed
            # by the test running beside this module is not taken for lost)
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 5},
        },
    )
    for _ in range(NODES):
        c.add_node(num_cpus=1, object_store_memory=STORE)
    ray.init(address=c.address, logging_level="WARNING")
    yield c
    ray.shutdown()
    c.shutdown()
    cloudpickle.unregister_pickle_by_value(datasets)
