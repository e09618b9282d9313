import { Suspense } from 'react'
import { getReport } from '../../lib/report.js'

// /report?k=...: the "use cache" report for k, computed at request time (k comes from the URL).
export default function Page({ searchParams }) {
  return (
    <main>
      <Suspense fallback={<p>loading</p>}>
        <Report searchParams={searchParams} />
      </Suspense>
    </main>
  )
}

async function Report({ searchParams }) {
  const { k = 'a' } = await searchParams
  const report = await getReport(String(k))
  return <p id="report">{`report k=${report.k} run=${report.run} nonce=${report.nonce}`}</p>
}
