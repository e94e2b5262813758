"""The environment a worker sees under the local launcher (RANK-style, two replicas), shared by
the tests of `runtime.env` and of the parts that read it."""

BASE = {
    "FTHSDP_RUN_DIR": "/tmp/run",
    "FTHSDP_REPLICA_ID": "1",
    "FTHSDP_NUM_REPLICAS": "2",
    "FTHSDP_LIGHTHOUSE": "http://127.0.0.1:29510",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29600",
}
