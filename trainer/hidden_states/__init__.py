"""Target hidden states for drafter training: offline shards on disk, a lazy reader, an online extractor.

On-disk format (`nodedeck-hidden-states/1`), a directory with:

    index.json  {"format", "model", "mode", "aux_layers", "hidden_size", "num_layers", "dtype",
                 "num_samples", "shard_samples", "data", "shards": [{"file", "ids", "num_tokens"}]}
    shard-00000.safetensors   for sample k (its position in the shard):
        "{k}.input_ids" int64 [T], "{k}.loss_mask" uint8 [T],
        "{k}.aux" dtype [T, len(aux_layers) * H]  (outputs of the aux layers, concatenated in order)
        "{k}.last" dtype [T, H]                  (final hidden state after the model's last norm)

Layer numbering: layer i is the i-th decoder layer (0-based); its OUTPUT is what is stored, i.e.
transformers' `hidden_states[i + 1]` (hidden_states[0] is the embedding output). Defaults:
EAGLE-3 `[1, L//2 - 1, L - 4]`; when those are not three distinct layers below L - 1 (L < 7),
three evenly spaced layers in 0..L-2 (L=4 -> [0, 1, 2]). DFlash: K evenly spaced layers in
1..L-3 (duplicates dropped; for L < 4 the range is 0..L-2); K = 1 is [L//2], as SpecForge.

Split capture: shard n always holds samples [n * shard_samples, (n + 1) * shard_samples) of the
data. Under `torchrun --nproc-per-node G` rank r of W computes shards r, r + W, ... on its own GPU
and, when every rank is done, the part indexes are gathered over the process group and the first
rank of each node writes index.json (nodes need not share a disk: each node's OUT then holds its
own shards and the whole index, and the others' shards are copied in before training);
`--part I/N` does the same for part I of N in independent processes (other nodes, or a restart
of one part), each part resuming from its own `index.part-I-of-N.json`, and the part that finds
all parts complete writes index.json. Either
way the directory holds exactly the shard files and index of one unsplit run.

Modules: capture.py runs the target and takes its hidden states (the online extractor), shards.py is the
shard format, its writer and the indexes, dataset.py the lazy reader, extract.py the offline extraction
into a directory (resume, parts, space check), cli.py `nodedeck-train hidden-states`.
"""
