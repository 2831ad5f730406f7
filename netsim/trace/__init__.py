"""Events as data: the record types, the streaming trace writer and reader."""
