"""Getting records from Kinesis: polling (GetRecords) now; enhanced fan-out later."""
