"""The central side of the agent message: validating and storing snapshots,
flagging claims that name vanished GPUs, finishing the jobs a snapshot answers.
It sits above fleet, claims and jobs, so none of those needs to know the others."""
