"""The status a job gets: observe (the API server's objects, reduced), conditions, compute (the whole status
from what is observed, as named steps) and events (the patch and the Events the operator writes)."""
