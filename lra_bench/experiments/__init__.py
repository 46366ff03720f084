"""Many runs, one record each: the cell (one run, the failure policy), the suite, the benchmark, records."""
