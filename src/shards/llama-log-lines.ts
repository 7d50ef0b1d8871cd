// Owns unwrapping engine output into the lines llama.cpp printed: CRI log records joined, colours,
// spaces and known prefixes stripped. Every regex is anchored with bounded repetition and longer
// lines are dropped (read as ''), so a tail parses in one linear pass and no input can make it throw.
const MAX_LINE_CHARS = 4096;
const MAX_PREFIX_STRIPS = 8;

const ANSI = /\u001b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]/g;
const WHITESPACE = /\s+/g;

// Tried in order, repeatedly, at the start of a line (spaces already collapsed to one).
const PREFIXES: readonly RegExp[] = [
  // journald / syslog: "Jan 30 09:13:15 host ollama[5307]: "
  /^[A-Z][a-z]{2} \d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,9})? [^ ]{1,253} [^ :[\]]{1,64}(?:\[\d{1,10}\])?: /,
  // ISO or docker timestamps: "2024-10-11T12:45:53.660Z ", "2026-05-17 10:44:25.389 | ", and
  // journalctl -o short-iso: "2024-01-30T09:13:15+0000 host ollama[5307]: "
  /^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?(?: [^ ]{1,253} [^ :[\]]{1,64}\[\d{1,10}\]:)?(?: \| | |$)/,
  // docker compose logs: "llamacpp-server-1  | " (service and replica, then a pipe)
  /^[A-Za-z0-9][\w.-]{0,63} \| /,
  // bracketed stamps and tags: "[1706570000] ", "[CORTEX]::Error: "
  /^\[[^\]]{0,64}\](?:::[A-Za-z]{1,16}:)? ?/,
  // llama.cpp --log-timestamps: "0.00.316.450 "
  /^\d{1,6}\.\d\d\.\d{3}\.\d{3} /,
  // llama.cpp --log-prefix level letter: "I ", "W "
  /^[IWEDT] /,
  // llama-server module tags (b9829+): "srv load_model: ", "cmn - CUDA0 : " (only before what we read)
  /^[a-z]{3,4} (?=- |Device \d|CUDA\d|Available devices:|\w{1,64}:(?: |$))/,
  // ...then its function (b10145): "cmn  common_param: device_info:", "cmn  common_param:   - CPU : "
  /^common_param: (?=device_info:$|- )/,
];

// A CRI record: "2026-05-17T10:44:25.389123456Z stderr F <text>" (tags may follow F or P after a
// colon). F ends a line; P is a piece of one, continued by the same stream's next record.
const RE_CRI_RECORD = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) (stdout|stderr) ([FP])(?::[^ ]{0,64})?(?: |$)/;

// Function prefixes that may follow an unknown prefix: the line is re-anchored at them.
const KNOWN_FUNCTION =
  /(?:ggml_cuda_init|ggml_init_cublas|ggml_cuda_set_main_device|llm_load_tensors|load_tensors|llama_model_load\w{0,32}|llama_load_model_from_file|llama_server|common_params_print_info|log_info): /;

function prefixLength(line: string): number {
  for (const re of PREFIXES) {
    const m = re.exec(line);
    if (m && m[0].length > 0) return m[0].length;
  }
  return 0;
}

/** The line with its prefixes, colours and repeated spaces removed; '' for lines too long to matter. */
function clean(raw: string): string {
  if (raw.length > MAX_LINE_CHARS) return '';
  let line = (raw.includes('\u001b') ? raw.replace(ANSI, '') : raw).replace(WHITESPACE, ' ').trim();
  for (let strips = 0; strips < MAX_PREFIX_STRIPS; strips += 1) {
    const length = prefixLength(line);
    if (length === 0) break;
    line = line.slice(length).trimStart();
  }
  const fn = KNOWN_FUNCTION.exec(line);
  return fn && fn.index > 0 ? line.slice(fn.index) : line;
}

/** The lines as the engine wrote them: CRI records' text, pieces (P) joined to the record that ends the line; a trailing piece waits. */
function criLines(lines: string[]): string[] {
  const pieces = new Map<string, string>();
  const whole: string[] = [];
  for (const line of lines) {
    const record = RE_CRI_RECORD.exec(line);
    if (record === null) {
      whole.push(line);
      continue;
    }
    const [prefix, stream, tag] = record as unknown as [string, string, string];
    // A line past what is read stays past it (and its pieces are not kept whole).
    const text = ((pieces.get(stream) ?? '') + line.slice(prefix.length)).slice(0, MAX_LINE_CHARS + 1);
    if (tag === 'P') pieces.set(stream, text);
    else {
      pieces.delete(stream);
      whole.push(text);
    }
  }
  return whole;
}

export function llamaLogLines(text: string): string[] {
  const lines = text.split(/\r\n|\r|\n/);
  // A final newline ends the last line; it does not start an empty one that would close a block.
  if (lines[lines.length - 1] === '') lines.pop();
  return criLines(lines).map(clean);
}
