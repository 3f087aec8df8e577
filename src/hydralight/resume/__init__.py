"""What a run continues from, and what it saves so that the next attempt can: the resume policy, last.ckpt,
preemption and requeue, and the decisions the ranks agree on at step boundaries."""
