"""What outlives a job, as versioned plain data: the formats of values and state, the journal's and the
capture's records, the journal (recovery, checkpoint markers, pruning, fencing) and the capture."""
