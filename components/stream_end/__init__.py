"""Stage (streaming only): the end marker of the extract loop, EOS or FAILED, for the trainer."""
