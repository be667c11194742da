"""Rendering of API objects: JSON for scripts, rich tables and summaries for people.

The CLI's consoles and the formatting of single values are in mwms/cli/formatting.py, the agents table in
mwms/cli/agent_tables.py, the jobs' tables and summaries in mwms/cli/job_tables.py; the commands import
them all from here.
"""

from __future__ import annotations

from mwms.cli.agent_tables import AGENT_STATE_STYLES as AGENT_STATE_STYLES
from mwms.cli.agent_tables import agent_status_text as agent_status_text
from mwms.cli.agent_tables import agents_table as agents_table
from mwms.cli.agent_tables import cordon_text as cordon_text
from mwms.cli.agent_tables import isolation_cell as isolation_cell
from mwms.cli.formatting import CLEAR_LINE as CLEAR_LINE
from mwms.cli.formatting import STATE_STYLES as STATE_STYLES
from mwms.cli.formatting import agent_memory as agent_memory
from mwms.cli.formatting import cells as cells
from mwms.cli.formatting import clear_status_line as clear_status_line
from mwms.cli.formatting import err as err
from mwms.cli.formatting import first_line as first_line
from mwms.cli.formatting import format_devices as format_devices
from mwms.cli.formatting import format_duration as format_duration
from mwms.cli.formatting import format_loss as format_loss
from mwms.cli.formatting import format_resources as format_resources
from mwms.cli.formatting import format_time as format_time
from mwms.cli.formatting import job_duration as job_duration
from mwms.cli.formatting import log_line_text as log_line_text
from mwms.cli.formatting import metric_value as metric_value
from mwms.cli.formatting import out as out
from mwms.cli.formatting import parse_time as parse_time
from mwms.cli.formatting import print_json as print_json
from mwms.cli.formatting import raw_log_line as raw_log_line
from mwms.cli.formatting import state_change_detail as state_change_detail
from mwms.cli.formatting import state_text as state_text
from mwms.cli.formatting import task_memory as task_memory
from mwms.cli.formatting import write_raw as write_raw
from mwms.cli.job_tables import artifacts_table as artifacts_table
from mwms.cli.job_tables import environment_rows as environment_rows
from mwms.cli.job_tables import jobs_table as jobs_table
from mwms.cli.job_tables import metrics_summary_table as metrics_summary_table
from mwms.cli.job_tables import metrics_table as metrics_table
from mwms.cli.job_tables import print_job as print_job
from mwms.cli.job_tables import tasks_table as tasks_table
