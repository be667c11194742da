"""Both workers print WAITING, then stay where they are: worker 1 sleeps in a named function (stack dump tests)."""

import os
import time


def wait_before_first_allreduce():
    print("WAITING", flush=True)
    time.sleep(600)


def read_input_forever():
    print("WAITING", flush=True)
    time.sleep(600)


if os.environ["MWMS_TASK_INDEX"] == "1":
    wait_before_first_allreduce()
else:
    read_input_forever()
